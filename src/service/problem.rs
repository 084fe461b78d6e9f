//! RFC 9457 problem details: every error the API answers, with a stable code.
//!
//! Invariants this module keeps:
//! - Every error response is `application/problem+json` with a fixed title per code, the HTTP
//!   status, the stable `code`, and where useful the offending JSON `pointer` or the job's
//!   current `job_status`. Never a request value, SQL, or internal error text.
//! - Database unavailability answers `503` with `Retry-After`.

use crate::codes::Code;
use crate::error::Error;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// An RFC 9457 problem document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// A URI reference naming the problem type (`about:blank`: the title says it all).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// A fixed, human-readable summary of the code.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// The stable code.
    pub code: &'static str,
    /// The JSON pointer of the offending member, for request problems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pointer: Option<String>,
    /// The job's current status, for conflicts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_status: Option<String>,
    /// A fixed sentence on this occurrence, where the title alone would leave the client
    /// guessing (never a request value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<&'static str>,
}

/// The HTTP status and fixed title of a code.
fn status_and_title(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::Unauthorized => (StatusCode::UNAUTHORIZED, "Missing or invalid credentials"),
        Code::RequestMalformed => (StatusCode::BAD_REQUEST, "The body is not valid JSON"),
        Code::IdempotencyKeyInvalid => (
            StatusCode::BAD_REQUEST,
            "Idempotency-Key is missing or not 1 to 255 characters",
        ),
        Code::QueryInvalid => (StatusCode::BAD_REQUEST, "A query parameter is not valid"),
        Code::RequestTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "The body is too large"),
        Code::UnsupportedMediaType => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "The body must be application/json",
        ),
        Code::NotFound => (StatusCode::NOT_FOUND, "No such job"),
        Code::NoSuchRoute => (StatusCode::NOT_FOUND, "No such resource"),
        Code::MethodNotAllowed => (
            StatusCode::METHOD_NOT_ALLOWED,
            "The resource does not serve this method",
        ),
        Code::Conflict => (StatusCode::CONFLICT, "The job has already ended"),
        Code::ScheduleInvalid => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "The schedule is not valid",
        ),
        Code::ReplayBodyMismatch => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "The body is not the failed job's request",
        ),
        Code::PayloadNotRetained => (
            StatusCode::CONFLICT,
            "No payload is retained for this letter: send the job's request again",
        ),
        Code::PayloadUnreadable => (
            StatusCode::CONFLICT,
            "The retained payload was sealed under a key no longer held: send the job's request again",
        ),
        Code::IdempotencyKeyReused => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "The idempotency key was used with a different request",
        ),
        Code::RequestInvalid
        | Code::DatasetInvalid
        | Code::KeyInvalid
        | Code::RecordsInvalid
        | Code::TooManyRecords
        | Code::TransformInvalid
        | Code::TransformTooLarge
        | Code::OutputTooLarge
        | Code::NumberOutOfRange
        | Code::RunAtInvalid
        | Code::ReplacesInvalid => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "The request does not match the ETL request schema",
        ),
        Code::DatabaseUnavailable | Code::TransientDatabase => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The database is unavailable; retry later",
        ),
        Code::CellMoved => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The cell is moving to another node; retry shortly",
        ),
        Code::OwnerMoved => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The owner is moving to another cell; retry shortly",
        ),
        Code::RequestTimeout => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The request took too long; retry later",
        ),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "Internal error"),
    }
}

impl Problem {
    /// The problem for `code`.
    pub fn new(code: Code) -> Problem {
        let (status, title) = status_and_title(code);
        Problem {
            kind: "about:blank",
            title,
            status: status.as_u16(),
            code: code.as_str(),
            pointer: None,
            job_status: None,
            detail: None,
        }
    }

    /// The same problem, saying `detail` too.
    pub fn because(self, detail: &'static str) -> Problem {
        Problem {
            detail: Some(detail),
            ..self
        }
    }

    /// The same problem pointing at a member of the request.
    pub fn at(mut self, pointer: String) -> Problem {
        self.pointer = Some(pointer);
        self
    }

    /// A conflict reporting the job's current status.
    pub fn conflict(job_status: String) -> Problem {
        Problem {
            job_status: Some(job_status),
            ..Problem::new(Code::Conflict)
        }
    }
}

impl From<Error> for Problem {
    fn from(e: Error) -> Problem {
        let code = e.code();
        if let Error::Rejected(r) = e {
            let problem = Problem::new(r.code).at(r.pointer);
            return Problem {
                detail: r.detail,
                ..problem
            };
        }
        let problem = Problem::new(code);
        if problem.status >= 500 {
            tracing::warn!(code = %code, "request failed");
        }
        problem
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(&self)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_status_and_a_fixed_title() {
        for code in Code::ALL {
            let p = Problem::new(*code);
            assert!(p.status >= 400, "{code}");
            assert!(!p.title.is_empty());
            assert_eq!(p.code, code.as_str());
        }
        assert_eq!(Problem::new(Code::DatasetInvalid).status, 422);
        assert_eq!(Problem::new(Code::LeaseLost).status, 500);
    }
}
