//! Connection strings pointed at another database, for the tools that own a throw-away one
//! (`demo`, `bench`).
//!
//! Invariants this module keeps:
//! - The connection string a tool is given is kept whole: its password, every host of a
//!   multi-host string and every parameter (`target_session_attrs`, `sslmode`, …) reach the
//!   throw-away database too; only the database name changes ([`with_dbname`]).

use crate::config::{ConfigError, DatabaseConfig};

/// Connection string `url` with its database changed to `name`, everything else kept: in a URL
/// (`postgres://` or `postgresql://`) the path is replaced (percent-encoded); a key-value string
/// (`host=… user=…`) gets a last `dbname=` (the last of a key wins).
///
/// # Errors
/// [`ConfigError::DatabaseUrl`] if `url` does not parse, before or after the change.
pub fn with_dbname(url: &str, name: &str) -> Result<String, ConfigError> {
    driver_config(url)?;
    let changed = match ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme).map(|rest| (scheme, rest)))
    {
        Some((scheme, rest)) => {
            // The authority (user, password, hosts) ends at the first `/` or `?`; the query
            // string, if any, at the first `?` after it.
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, after) = rest.split_at(authority_end);
            let query = after.find('?').map_or("", |at| &after[at..]);
            format!("{scheme}{authority}/{}{query}", percent_encode(name))
        }
        None => format!(
            "{url} dbname='{}'",
            name.replace('\\', "\\\\").replace('\'', "\\'")
        ),
    };
    if driver_config(&changed)?.get_dbname() == Some(name) {
        Ok(changed)
    } else {
        Err(ConfigError::DatabaseUrl)
    }
}

/// The driver's settings of `url`, its TLS parameters (which the driver does not all know) aside.
fn driver_config(url: &str) -> Result<tokio_postgres::Config, ConfigError> {
    DatabaseConfig::new(url).driver_url().map(|(pg, _)| pg)
}

/// `text` with every byte outside the URL's unreserved set (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Quotes an SQL identifier: wraps it in double quotes and doubles any inside.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
