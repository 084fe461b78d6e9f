//! Unit tests of the submission window and the listing cursor.

use super::*;

/// The time `rfc3339`.
fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_default()
}

#[test]
fn a_window_bounds_ids_by_their_millisecond_and_saturates_at_both_ends() {
    let id = Uuid::now_v7();
    let millis = i64::try_from(id.as_u128() >> 80).unwrap_or_default();
    let made = DateTime::from_timestamp_millis(millis).unwrap_or_default();
    let next = made + chrono::Duration::milliseconds(1);
    let window = Window::submitted(Some(made), Some(next));
    assert!(window.from.is_some_and(|from| from <= id));
    assert!(window.before.is_some_and(|before| id < before));
    let later = Window::submitted(Some(next), None);
    assert!(later.from.is_some_and(|from| id < from) && later.before.is_none());
    let far = Window::submitted(Some(at("1960-01-01T00:00:00Z")), None);
    assert_eq!(far.from, Some(Uuid::nil()));
    let future = DateTime::<Utc>::MAX_UTC;
    let beyond = Window::submitted(None, Some(future));
    assert!(beyond.before.is_some_and(|before| before > Uuid::now_v7()));
}

#[test]
fn a_cursor_narrows_a_window_and_never_widens_it() {
    let (a, b) = (Uuid::from_u128(5), Uuid::from_u128(9));
    let open = Window::default();
    assert_eq!(open.after(None), open);
    assert_eq!(open.after(Some(a)).before, Some(a));
    let bounded = Window {
        before: Some(a),
        from: None,
    };
    assert_eq!(bounded.after(Some(b)).before, Some(a));
    assert_eq!(bounded.after(None).before, Some(a));
    let wide = Window {
        before: Some(b),
        from: Some(a),
    };
    assert_eq!(
        wide.after(Some(a)),
        Window {
            before: Some(a),
            from: Some(a)
        }
    );
}
