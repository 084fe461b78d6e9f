//! Connection strings pointed at another database, for the tools that own a throw-away one
//! (`demo`, `bench`), or at another node, for a cell whose tables live on a Citus worker
//! (`db::citus`).
//!
//! Invariants this module keeps:
//! - The connection string a tool is given is kept whole: its password, every host of a
//!   multi-host string and every parameter (`target_session_attrs`, `sslmode`, …) reach the
//!   throw-away database too; only the database name changes ([`with_dbname`]).
//! - A string pointed at a node keeps everything but its hosts, which become that one node
//!   ([`with_node`]); a string the driver would read otherwise is refused, never guessed at.

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

/// Connection URL `url` (`postgres://` or `postgresql://`) with its hosts replaced by the one
/// node `host`:`port`; user, password, database and parameters kept.
///
/// # Errors
/// [`ConfigError::NodeUrl`] for a key-value string, or a URL that names its hosts in its
/// parameters (the driver would not connect to the node alone); [`ConfigError::DatabaseUrl`] if
/// `url` does not parse.
pub fn with_node(url: &str, host: &str, port: u16) -> Result<String, ConfigError> {
    driver_config(url)?;
    let (scheme, rest) = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme).map(|rest| (scheme, rest)))
        .ok_or(ConfigError::NodeUrl)?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let user = authority.rfind('@').map_or("", |at| &authority[..=at]);
    let host_part = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let changed = format!("{scheme}{user}{host_part}:{port}{after}");
    let driver = driver_config(&changed)?;
    let one_node = matches!(driver.get_hosts(), [tokio_postgres::config::Host::Tcp(h)] if h == host)
        && driver.get_ports() == [port]
        && driver.get_hostaddrs().is_empty();
    if one_node {
        Ok(changed)
    } else {
        Err(ConfigError::NodeUrl)
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
