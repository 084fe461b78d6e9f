//! What the dead-letter forms carry: the filter of the page and of the bulk actions, read and
//! validated, and which action a form asks for.
//!
//! Invariants this module keeps:
//! - A filter value that is not one (a queue or kind that is not a name, a code that is not an
//!   identifier, a time that is not one, an owner digest that is not 32 bytes of hex) makes the
//!   whole filter refused: nothing of it reaches the database or a page.
//! - An owner filter is an operator's only; a principal typed there is kept as its digest only,
//!   and a filter is written back ([`Chosen::fields`], [`Chosen::query`]) with that digest,
//!   never the principal. Its audit summary ([`Chosen::summary`]) names neither.

use super::when::{field_time, utc_field};
use crate::dead_letters::LetterFilter;
use crate::names::{is_identifier, is_kind_name};
use crate::queue::is_queue_name;
use crate::service::api_keys::Role;
use crate::service::audit;
use chrono::{DateTime, Utc};
use serde::Deserialize;

/// The filter fields of the page's form and of the bulk actions' forms, as sent (validated by
/// [`Chosen::parse`]).
#[derive(Debug, Default, Deserialize)]
pub(super) struct FilterFields {
    /// A queue's name (empty: any).
    #[serde(default)]
    pub(super) queue: String,
    /// A kind's name (empty: any).
    #[serde(default)]
    pub(super) kind: String,
    /// A failure code (empty: any).
    #[serde(default)]
    pub(super) code: String,
    /// Failed at or after this time, UTC, as a `datetime-local` field sends it (empty: open).
    #[serde(default)]
    pub(super) since: String,
    /// Failed before this time, UTC (empty: open).
    #[serde(default)]
    pub(super) until: String,
    /// An owner's principal, typed by an operator (answered with a redirect to `owner_key`).
    #[serde(default)]
    pub(super) owner: String,
    /// An owner's digest, in hex (operators only).
    #[serde(default)]
    pub(super) owner_key: String,
}

/// A validated filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Chosen {
    /// Only this queue's letters.
    pub(crate) queue: Option<String>,
    /// Only this kind's.
    pub(crate) kind: Option<String>,
    /// Only those with this code.
    pub(crate) code: Option<String>,
    /// Only those that failed at or after this time.
    pub(crate) since: Option<DateTime<Utc>>,
    /// Only those that failed before this time.
    pub(crate) until: Option<DateTime<Utc>>,
    /// Only this owner's (its digest; operators only).
    pub(crate) owner: Option<[u8; 32]>,
}

impl Chosen {
    /// The filter `fields` name, for a viewer of `role` (an owner filter is an operator's
    /// only, and ignored for anyone else), with the principal hashed by `digest`; `Err` when a
    /// field is not a value it could hold.
    pub(super) fn parse(
        fields: &FilterFields,
        role: Role,
        digest: impl Fn(&str) -> [u8; 32],
    ) -> Result<Chosen, ()> {
        let text = |value: &str, ok: fn(&str) -> bool| -> Result<Option<String>, ()> {
            let value = value.trim();
            match value {
                "" => Ok(None),
                v if ok(v) => Ok(Some(v.to_owned())),
                _ => Err(()),
            }
        };
        let owner = match (role, fields.owner.trim(), fields.owner_key.trim()) {
            (Role::Operator, "", "") => None,
            (Role::Operator, "", hex) => {
                let bytes = hex::decode(hex).map_err(|_| ())?;
                Some(<[u8; 32]>::try_from(bytes).map_err(|_| ())?)
            }
            (Role::Operator, principal, _) => Some(digest(principal)),
            _ => None,
        };
        Ok(Chosen {
            queue: text(&fields.queue, is_queue_name)?,
            kind: text(&fields.kind, is_kind_name)?,
            code: text(&fields.code, |c| is_identifier(c, &[]))?,
            since: utc_field(&fields.since)?,
            until: utc_field(&fields.until)?,
            owner,
        })
    }

    /// The library's filter of this one.
    pub(super) fn filter(&self) -> LetterFilter<'_> {
        LetterFilter {
            queue: self.queue.as_deref(),
            kind: self.kind.as_deref(),
            code: self.code.as_deref(),
            since: self.since,
            until: self.until,
        }
    }

    /// The filter as form fields (name, value), the owner by its digest: the page's query and
    /// the bulk forms' hidden fields. Every value is a name, an identifier, a formatted time or
    /// hex: nothing needs escaping in a query.
    pub(crate) fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = Vec::new();
        let mut add = |name, value: Option<String>| {
            if let Some(value) = value {
                fields.push((name, value));
            }
        };
        add("queue", self.queue.clone());
        add("kind", self.kind.clone());
        add("code", self.code.clone());
        add("since", self.since.map(field_time));
        add("until", self.until.map(field_time));
        add("owner_key", self.owner.map(hex::encode));
        fields
    }

    /// The filter as a query string (`queue=mail&code=x`; empty for none).
    pub(crate) fn query(&self) -> String {
        self.fields()
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The filter in words for the audit log ([`audit::filter_target`]): its fields, the owner
    /// as "one owner" (never a principal, nor its digest); `all letters` for none.
    pub(crate) fn summary(&self) -> String {
        audit::filter_target(&self.filter(), self.owner.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in digest: the principal's first byte, repeated.
    fn digest(p: &str) -> [u8; 32] {
        [p.as_bytes()[0]; 32]
    }

    #[test]
    fn a_filter_is_validated_and_carries_an_owner_by_its_digest_only() {
        let fields = FilterFields {
            queue: "mail".into(),
            code: "mailbox_gone".into(),
            since: "2026-12-01T07:30".into(),
            owner: "alice".into(),
            ..FilterFields::default()
        };
        let chosen = Chosen::parse(&fields, Role::Operator, digest).unwrap_or_default();
        assert_eq!(chosen.owner, Some([b'a'; 32]));
        let query = chosen.query();
        assert!(
            query.starts_with(
                "queue=mail&code=mailbox_gone&since=2026-12-01T07:30:00&owner_key=6161"
            ),
            "{query}"
        );
        assert!(!query.contains("alice"));
        assert_eq!(
            chosen.summary(),
            "queue=mail code=mailbox_gone since=2026-12-01T07:30:00 one owner"
        );
        let again = FilterFields {
            owner_key: hex::encode([b'a'; 32]),
            ..FilterFields::default()
        };
        let same = Chosen::parse(&again, Role::Operator, digest).unwrap_or_default();
        assert_eq!(same.owner, chosen.owner);
        let owners = Chosen::parse(&fields, Role::Owner, digest).unwrap_or_default();
        assert_eq!(owners.owner, None, "an owner's session has no owner filter");
        assert_eq!(Chosen::default().summary(), "all letters");
        for bad in [
            FilterFields {
                queue: "Not A Queue".into(),
                ..FilterFields::default()
            },
            FilterFields {
                code: "x'--".into(),
                ..FilterFields::default()
            },
            FilterFields {
                until: "tomorrow".into(),
                ..FilterFields::default()
            },
            FilterFields {
                owner_key: "zz".into(),
                ..FilterFields::default()
            },
        ] {
            assert!(
                Chosen::parse(&bad, Role::Operator, digest).is_err(),
                "{bad:?}"
            );
        }
    }
}
