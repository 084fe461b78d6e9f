//! What a connection URL asks of TLS: libpq's `sslmode` (all five values) and `sslrootcert`,
//! read here because tokio-postgres's own parser knows only `disable`, `prefer` and `require`.
//!
//! Invariants this module keeps:
//! - [`split_url`] hands tokio-postgres the URL with `sslrootcert` removed and `verify-ca` or
//!   `verify-full` rewritten to `require` (what the driver must do on the wire: ask for TLS and
//!   never fall back); every other parameter, and the URL's form (`postgres://…` or
//!   `key=value …`), is left as written.
//! - What is verified is decided by [`TlsRequest`] alone, never by the driver's `sslmode`.
//! - A value that libpq would refuse (`sslmode=allow`, a misspelling) is refused here
//!   ([`ConfigError::SslMode`]), never silently read as the default.

use super::ConfigError;
use std::path::PathBuf;

/// libpq's `sslmode`: whether a connection is encrypted, and what of the server's certificate is
/// checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it, else plaintext; the certificate is not checked. The default,
    /// as in libpq and tokio-postgres.
    #[default]
    Prefer,
    /// TLS or no connection; the certificate is not checked, unless a root certificate is given
    /// (then as [`SslMode::VerifyCa`], as libpq does).
    Require,
    /// TLS, and the server's certificate chain must lead to a trusted root; its name is not
    /// checked.
    VerifyCa,
    /// TLS, the chain must lead to a trusted root, and the certificate must name the host
    /// connected to.
    VerifyFull,
}

impl SslMode {
    /// The mode named `value` (libpq's spelling).
    ///
    /// # Errors
    /// [`ConfigError::SslMode`] for any other value.
    fn parse(value: &str) -> Result<SslMode, ConfigError> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            _ => Err(ConfigError::SslMode),
        }
    }

    /// libpq's name of this mode.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The `sslmode` tokio-postgres is handed for this mode: the verifying modes are `require`
    /// on the wire (what is verified is this crate's TLS connector's business).
    fn for_driver(self) -> &'static str {
        match self {
            SslMode::VerifyCa | SslMode::VerifyFull => "require",
            mode => mode.name(),
        }
    }
}

/// What a connection URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsRequest {
    /// Its `sslmode`; [`SslMode::Prefer`] when it has none.
    pub mode: SslMode,
    /// Its `sslrootcert`: a PEM file of the certificates to trust as roots.
    pub root_cert: Option<PathBuf>,
}

/// Splits `url` into the URL tokio-postgres is handed (see the module's invariants) and what it
/// asks of TLS. Either form of connection string is read: a `postgres://` (or `postgresql://`)
/// URL's query parameters, or `key=value` pairs.
///
/// # Errors
/// [`ConfigError::SslMode`] for an `sslmode` libpq does not know. A string that is not a
/// connection string at all is handed on as it is, for tokio-postgres to refuse.
pub fn split_url(url: &str) -> Result<(String, TlsRequest), ConfigError> {
    let uri = ["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    let (kept, found) = if uri {
        split_query(url)
    } else {
        split_pairs(url)
    };
    let mut request = TlsRequest::default();
    let mut mode = None;
    for (key, value) in found {
        match key {
            Key::Mode => mode = Some(SslMode::parse(&value)?),
            Key::RootCert => request.root_cert = Some(PathBuf::from(value)),
        }
    }
    let Some(mode) = mode else {
        return Ok((kept, request));
    };
    request.mode = mode;
    let driver_mode = mode.for_driver();
    let kept = match (uri, kept.contains('?')) {
        (true, true) => format!("{kept}&sslmode={driver_mode}"),
        (true, false) => format!("{kept}?sslmode={driver_mode}"),
        (false, _) => format!("{kept} sslmode={driver_mode}"),
    };
    Ok((kept, request))
}

/// A TLS parameter this module reads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// `sslmode`.
    Mode,
    /// `sslrootcert`.
    RootCert,
}

impl Key {
    /// The parameter named `name`, if it is one of ours.
    fn of(name: &str) -> Option<Key> {
        match name {
            "sslmode" => Some(Key::Mode),
            "sslrootcert" => Some(Key::RootCert),
            _ => None,
        }
    }
}

/// A URL's query parameters split: the URL without ours, and ours (values percent-decoded), in
/// order.
fn split_query(url: &str) -> (String, Vec<(Key, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut found = Vec::new();
    for param in query.split('&') {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        match Key::of(name) {
            Some(key) => found.push((key, decode(value))),
            None => kept.push(param),
        }
    }
    let url = match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (url, found)
}

/// A percent-encoded URL value, decoded (invalid UTF-8 replaced, as a path would not open).
fn decode(value: &str) -> String {
    percent_encoding::percent_decode_str(value)
        .decode_utf8_lossy()
        .into_owned()
}

/// `key=value` pairs split: the string without ours, and ours (values unquoted), in order. Read
/// as tokio-postgres reads them: whitespace between pairs and around `=`, a value either quoted
/// (`'…'`) or running to the next whitespace, a backslash escaping the next character. A string
/// that does not read so is handed on whole, for tokio-postgres to refuse.
fn split_pairs(pairs: &str) -> (String, Vec<(Key, String)>) {
    let mut kept = String::new();
    let mut found = Vec::new();
    let mut rest = pairs;
    while let Some((pair, name, value, after)) = next_pair(rest) {
        match Key::of(name) {
            Some(key) => found.push((key, value)),
            None => kept.push_str(pair),
        }
        rest = after;
    }
    if !rest.trim().is_empty() {
        return (pairs.to_owned(), Vec::new());
    }
    (kept, found)
}

/// The next `key=value` pair of `text`: its text (with the whitespace before it), key, value
/// (unquoted, unescaped) and what follows it; `None` at the end or where `text` does not read
/// as a pair.
fn next_pair(text: &str) -> Option<(&str, &str, String, &str)> {
    let key_at = text.len() - text.trim_start().len();
    let key_len = text[key_at..].find(|c: char| c.is_whitespace() || c == '=')?;
    let key = &text[key_at..key_at + key_len];
    let after_key = text[key_at + key_len..].trim_start();
    let after_eq = after_key.strip_prefix('=')?.trim_start();
    let value_at = text.len() - after_eq.len();
    let (value, len) = value_of(after_eq)?;
    let end = value_at + len;
    (!key.is_empty()).then(|| (&text[..end], key, value, &text[end..]))
}

/// The value at the start of `text` (quoted or not, backslash escapes undone) and how many bytes
/// of `text` it took; `None` for an empty or unterminated one.
fn value_of(text: &str) -> Option<(String, usize)> {
    let quoted = text.starts_with('\'');
    let mut value = String::new();
    let mut chars = text.char_indices().skip(usize::from(quoted));
    while let Some((at, c)) = chars.next() {
        match c {
            '\'' if quoted => return Some((value, at + 1)),
            c if c.is_whitespace() && !quoted => return Some((value, at)),
            '\\' => value.extend(chars.next().map(|(_, escaped)| escaped)),
            c => value.push(c),
        }
    }
    (!quoted && !value.is_empty()).then_some((value, text.len()))
}

#[cfg(test)]
mod tests;
