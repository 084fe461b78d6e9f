//! Diagnoses: the chain named by type (probed links, the unknown placeholder, the bound), the
//! detail bounded deterministically, and no error text anywhere in the JSON.

use super::record::bounded_name;
use super::*;
use crate::codes::Code;
use crate::JobError;

/// An error of a type no probe knows, with `source` behind it and `text` as its message.
#[derive(Debug)]
struct Opaque {
    /// Its message (a canary: must never be stored).
    text: &'static str,
    /// What caused it.
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl std::fmt::Display for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text)
    }
}

impl StdError for Opaque {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// The type names of a failure's chain.
fn names(error: &JobError) -> Vec<String> {
    error
        .chain()
        .links
        .into_iter()
        .map(|l| l.type_name)
        .collect()
}

#[test]
fn a_transient_io_error_is_named_by_type_and_kind_never_by_its_message() {
    let error = JobError::transient(std::io::Error::other("CANARY-io"));
    let chain = error.chain();
    assert_eq!(chain.links.len(), 1);
    assert_eq!(chain.links[0].type_name, "std::io::error::Error");
    assert_eq!(chain.links[0].io_kind.as_deref(), Some("Other"));
    let json = Diagnosis::new(Phase::Compute, Decision::Retry, Some(20), 5)
        .with_chain(chain)
        .to_json()
        .to_string();
    assert!(!json.contains("CANARY"), "{json}");
    assert!(json.contains("\"delay_ms\":20"), "{json}");
    // The source still reads as the handler's error, for the handler's own use.
    assert_eq!(
        error.cause().map(ToString::to_string).as_deref(),
        Some("CANARY-io")
    );
    let io = error
        .cause()
        .and_then(|c| c.downcast_ref::<std::io::Error>());
    assert_eq!(
        io.map(std::io::Error::kind),
        Some(std::io::ErrorKind::Other)
    );
}

#[test]
fn the_given_type_names_the_first_link_and_later_unknown_links_get_the_placeholder() {
    let inner = Opaque {
        text: "CANARY-inner",
        source: Some(Box::new("12x".parse::<u8>().unwrap_err())),
    };
    let outer = Opaque {
        text: "CANARY-outer",
        source: Some(Box::new(inner)),
    };
    let error = JobError::transient(outer);
    assert_eq!(
        names(&error),
        [
            std::any::type_name::<Opaque>(),
            UNKNOWN_TYPE,
            "core::num::error::ParseIntError"
        ]
    );
    // A variant built directly: its type was never seen, so even the first link is probed.
    let direct = JobError::Transient(Box::new(Opaque {
        text: "CANARY",
        source: None,
    }));
    assert_eq!(names(&direct), [UNKNOWN_TYPE]);
    // A string's type is its name; its text is not.
    assert_eq!(names(&JobError::transient("CANARY-text")), ["&str"]);
}

#[test]
fn a_long_chain_is_cut_at_the_bound_and_says_so() {
    let mut error = Opaque {
        text: "CANARY",
        source: None,
    };
    for _ in 0..20 {
        error = Opaque {
            text: "CANARY",
            source: Some(Box::new(error)),
        };
    }
    let chain = JobError::transient(error).chain();
    assert_eq!(chain.links.len(), MAX_CHAIN);
    assert!(chain.cut);
    let short = JobError::transient(std::io::Error::other("x")).chain();
    assert!(!short.cut);
}

#[test]
fn crate_database_and_json_errors_are_probed_for_their_enumerated_facts() {
    let crate_error = JobError::from(crate::Error::Config(crate::ConfigError::Priority));
    let link = &crate_error.chain().links[0];
    assert_eq!(link.type_name, "durable_etl::error::Error");
    assert_eq!(link.code.as_deref(), Some(Code::ConfigInvalid.as_str()));
    let json = serde_json::from_str::<u8>("\"CANARY\"").unwrap_err();
    let link = &JobError::permanent(Code::HandlerFailed)
        .with_source(json)
        .chain()
        .links[0];
    assert_eq!(link.type_name, "serde_json::error::Error");
    assert_eq!(link.json.as_deref(), Some("data"));
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "CANARY");
    let link = &JobError::failed("kind_code")
        .with_source(refused)
        .chain()
        .links[0];
    assert_eq!(link.io_kind.as_deref(), Some("ConnectionRefused"));
    assert!(JobError::permanent(Code::HandlerFailed)
        .chain()
        .links
        .is_empty());
}

#[test]
fn a_long_type_name_is_cut_at_a_character_boundary() {
    let long = "é".repeat(MAX_TYPE_NAME);
    let cut = bounded_name(&long);
    assert!(cut.len() <= MAX_TYPE_NAME, "{}", cut.len());
    assert!(cut.ends_with('…'));
    assert_eq!(
        bounded_name("std::io::error::Error"),
        "std::io::error::Error"
    );
}

#[test]
fn the_detail_is_kept_in_order_within_its_bounds_and_the_rest_counted() {
    let detail = Detail::new()
        .field("smtp_reply", 421)
        .field("tls", true)
        .field("relay", "eu-west-1")
        .field("huge", u64::MAX)
        .field("smtp_reply", 450);
    let error = JobError::transient(std::io::Error::other("CANARY")).with_detail(detail);
    let diagnosis = Diagnosis::new(Phase::Effects, Decision::Fail, Some(5), 1)
        .with_detail(error.detail().unwrap());
    assert_eq!(diagnosis.delay_ms, None, "a failure has no delay");
    let kept = diagnosis.detail.clone().unwrap();
    assert_eq!(kept["smtp_reply"], 450);
    assert_eq!(kept["tls"], true);
    assert_eq!(kept["relay"], "eu-west-1");
    assert_eq!(kept["huge"], serde_json::json!(u64::MAX));
    assert_eq!(diagnosis.detail_dropped, None);
    // The source and its chain survive the detail.
    assert_eq!(names(&error), ["std::io::error::Error"]);

    // Badly formed fields are dropped and counted.
    let bad = Detail::new()
        .field("Not an identifier", 1)
        .field("sentence", "two words")
        .field("ok", 1);
    let (kept, dropped) = bad.bounded();
    assert_eq!((kept.len(), dropped), (1, 2));

    // Over the field bound: the first sixteen stay, every time.
    const NAMES: [&str; 20] = [
        "f00", "f01", "f02", "f03", "f04", "f05", "f06", "f07", "f08", "f09", "f10", "f11", "f12",
        "f13", "f14", "f15", "f16", "f17", "f18", "f19",
    ];
    let many = NAMES.iter().fold(Detail::new(), |d, name| d.field(name, 1));
    let (kept, dropped) = many.bounded();
    assert_eq!((kept.len(), dropped), (MAX_DETAIL_FIELDS, 4));
    assert!(kept.contains_key("f15") && !kept.contains_key("f16"));
    assert_eq!(many.bounded(), (kept, dropped), "deterministic");

    // Over the size bound: fields past it are dropped, and the stored object stays within it.
    const TAG: &str = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghij";
    let wide = NAMES
        .iter()
        .fold(Detail::new(), |d, name| d.field(name, TAG));
    let (kept, dropped) = wide.bounded();
    assert!(dropped > 0);
    assert!(serde_json::Value::Object(kept.clone()).to_string().len() <= MAX_DETAIL_BYTES);
    assert_eq!(kept.len() + dropped as usize, NAMES.len());
}

#[test]
fn a_detail_without_an_error_is_carried_by_a_permanent_failure() {
    let error = JobError::failed("quota_spent").with_detail(Detail::new().field("used", 3));
    assert!(error.chain().links.is_empty());
    assert_eq!(error.detail().map(Detail::is_empty), Some(false));
    let with_source = error.with_source(std::io::Error::other("CANARY"));
    assert_eq!(names(&with_source), ["std::io::error::Error"]);
    assert!(
        with_source.detail().is_some(),
        "the detail stays with a new source"
    );
}

#[test]
fn a_stored_diagnosis_reads_back_and_an_unreadable_one_is_absent() {
    let diagnosis = Diagnosis::new(Phase::Recovery, Decision::Retry, Some(0), 12)
        .with_chain(JobError::transient(std::io::Error::other("x")).chain());
    assert_eq!(Diagnosis::from_json(diagnosis.to_json()), Some(diagnosis));
    assert_eq!(
        Diagnosis::from_json(serde_json::json!({"phase": "elsewhere"})),
        None
    );
}

#[test]
fn a_walk_of_the_source_chain_still_finds_the_handlers_error() {
    let error = JobError::transient(std::io::Error::other("CANARY"));
    let mut link: Option<&(dyn StdError + 'static)> = Some(&error);
    let mut found = false;
    while let Some(e) = link {
        found |= e.is::<std::io::Error>();
        link = e.source();
    }
    assert!(found, "the I/O error is a link of the chain");
}

#[test]
fn a_job_error_inside_another_errors_chain_is_one_link_named_by_its_source() {
    let nested = JobError::transient(std::io::Error::other("CANARY"));
    let outer = Opaque {
        text: "CANARY",
        source: Some(Box::new(nested)),
    };
    let chain = chain_of(None, &outer);
    let names: Vec<&str> = chain.links.iter().map(|l| l.type_name.as_str()).collect();
    // The outer error, the `JobError` (a type no probe knows), then its source once.
    assert_eq!(names, [UNKNOWN_TYPE, UNKNOWN_TYPE, "std::io::error::Error"]);
}
