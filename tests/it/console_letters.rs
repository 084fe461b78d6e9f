//! The console's dead letters over HTTP: the page is owner-scoped (another owner's letter and
//! its job answer `404`), filtered, counted and paged; an operator sees every owner's and
//! narrows them to one owner by digest, never by a principal a page shows; every action needs
//! the session's token, previews what it takes, and acts only once confirmed; a replay records
//! the signed-in key's id.

use crate::console::{Console, Page, SECRET};
use durable_etl::config::PAYLOAD_KEY_ID_DEFAULT;
use durable_etl::dead_letters::PayloadKey;
use durable_etl::digest::{DigestKind, Secret};
use reqwest::StatusCode;
use tokio_postgres::Client;
use uuid::Uuid;

/// The owner digest of `principal` under the tests' secret.
pub(crate) fn owner(principal: &str) -> [u8; 32] {
    Secret::new(SECRET)
        .unwrap()
        .digest(DigestKind::Principal, principal.as_bytes())
}

/// Makes `n` open letters of kind `etl.load` for `principal` by hand (intake rows, failed
/// outcomes and letters) in `queue` with `code`, failed one second apart before now, their
/// payloads retained under the deployment's key when `retained`; returns their ids, newest
/// first.
pub(crate) async fn letters_by_hand(
    client: &Client,
    principal: &str,
    n: i64,
    queue: &str,
    code: &str,
    retained: bool,
) -> Vec<Uuid> {
    let owner = owner(principal);
    let rows = client
        .query(
            "WITH made AS (
                 SELECT gen_random_uuid() AS id, now() - (g * interval '1 second') AS at, g
                   FROM generate_series(1, $2::int8) AS g
             ), intake AS (
                 INSERT INTO etl_job_intake (id, owner_key, idempotency_key_digest,
                        request_fingerprint, kind, max_attempts, run_at, queue)
                 SELECT id, $1::bytea, sha256(id::text::bytea), sha256(id::text::bytea),
                        'etl.load', 3, at, $3::text
                   FROM made RETURNING id
             ), outcome AS (
                 INSERT INTO etl_job_outcomes (job_id, owner_key, status, attempts, run_at,
                        failure_code, finished_at)
                 SELECT id, $1::bytea, 'failed', 3, at, $4::text, at FROM made
             ), letter AS (
                 INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts,
                        failed_at)
                 SELECT m.id, $1::bytea, $3::text, 'etl.load', $4::text, 3, m.at
                   FROM made m JOIN intake i ON i.id = m.id
             )
             SELECT id FROM made ORDER BY g",
            &[&&owner[..], &n, &queue, &code],
        )
        .await
        .unwrap();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.get(0)).collect();
    if retained {
        let key =
            PayloadKey::derive(&Secret::new(SECRET).unwrap(), PAYLOAD_KEY_ID_DEFAULT).unwrap();
        let payload = serde_json::json!({"dataset": "d", "key": "id", "records": [{"id": 1}]});
        for id in &ids {
            client
                .execute(
                    "INSERT INTO etl_retained_payloads (job_id, key_id, sealed, ttl_s)
                     VALUES ($1, $2, $3, 3600)",
                    &[id, &PAYLOAD_KEY_ID_DEFAULT, &key.seal(*id, &payload)],
                )
                .await
                .unwrap();
        }
    }
    ids
}

/// How many of `ids` `page` shows.
fn shown(page: &Page, ids: &[Uuid]) -> usize {
    ids.iter()
        .filter(|id| page.body.contains(&id.to_string()))
        .count()
}

#[tokio::test]
async fn console_dead_letters_are_owner_scoped_filtered_counted_and_paged() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let mail = letters_by_hand(&client, "bob", 52, "mail", "mailbox_gone", false).await;
    let bills = letters_by_hand(&client, "bob", 2, "bills", "attempts_exhausted", true).await;
    let carols = letters_by_hand(&client, "carol", 2, "mail", "mailbox_gone", false).await;
    let bob = console.sign_in(&console.bob).await;

    // Bob's letters, newest first, 50 a page, with counts per queue and code; never carol's.
    let first = console.get("/console/dead-letters", &bob).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.body.contains("54 open letters match."),
        "{}",
        first.body
    );
    assert!(first.body.contains("Your letters."));
    assert_eq!(shown(&first, &mail) + shown(&first, &bills), 50);
    assert_eq!(shown(&first, &carols), 0);
    assert!(first
        .body
        .contains(&format!("href=\"/console/jobs/{}\"", mail[0])));
    assert!(
        !first.body.contains("id=\"owner\""),
        "no owner filter for an owner"
    );
    let next = first
        .body
        .split("href=\"/console/dead-letters?after=")
        .nth(1)
        .unwrap();
    let token = &next[..next.find('"').unwrap()];
    let second = console
        .get(&format!("/console/dead-letters?after={token}"), &bob)
        .await;
    assert_eq!(shown(&second, &mail) + shown(&second, &bills), 4);
    assert!(!second.body.contains("Older letters"));

    // Filters by queue and code, and by time; counts follow the filter.
    let billed = console
        .get("/console/dead-letters?queue=bills&code=&since=", &bob)
        .await;
    assert_eq!(shown(&billed, &bills), 2);
    assert_eq!(shown(&billed, &mail), 0);
    assert!(billed.body.contains("2 open letters match."));
    assert!(billed.body.contains("value=\"bills\""));
    let future = console
        .get("/console/dead-letters?since=2999-01-01T00:00", &bob)
        .await;
    assert!(future.body.contains("No open letter matches."));
    // A filter that is not one is refused and never echoed.
    for bad in [
        "queue=Canary%20Queue",
        "code=canary'--",
        "until=canary",
        "after=canary",
    ] {
        let refused = console
            .get(&format!("/console/dead-letters?{bad}"), &bob)
            .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(!refused.body.to_lowercase().contains("canary"), "{bad}");
    }

    // Another owner's letter and its job are not bob's: 404 everywhere, even with his token.
    let csrf = first.csrf();
    let theirs = carols[0];
    assert_eq!(
        console
            .get(&format!("/console/jobs/{theirs}"), &bob)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    for action in ["replay", "discard"] {
        for confirm in ["", "&confirm=yes"] {
            let path = format!("/console/dead-letters/{theirs}/{action}");
            let answer = console
                .post(&path, &bob, &format!("csrf={csrf}{confirm}"))
                .await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}{confirm}");
        }
    }
    assert_eq!(
        crate::support::count(&client, "etl_dead_letters WHERE replayed_job_id IS NULL").await,
        56,
        "nothing replayed or discarded"
    );

    // An operator sees every owner's letters, and narrows them to one owner: the page answers
    // the principal with a redirect to the owner's digest, and never shows the principal.
    let alice = console.sign_in(&console.alice).await;
    let all = console.get("/console/dead-letters", &alice).await;
    assert!(all.body.contains("56 open letters match."), "{}", all.body);
    assert!(all.body.contains("Every owner's letters."));
    let narrowed = console
        .get("/console/dead-letters?owner=carol", &alice)
        .await;
    assert_eq!(narrowed.status, StatusCode::SEE_OTHER);
    let location = narrowed.location();
    assert_eq!(
        location,
        format!(
            "/console/dead-letters?owner_key={}",
            hex::encode(owner("carol"))
        )
    );
    let carol = console.get(location, &alice).await;
    assert_eq!(shown(&carol, &carols), 2);
    assert_eq!(shown(&carol, &mail), 0);
    assert!(carol.body.contains("Showing one owner's letters."));
    assert!(!carol.body.contains("carol"), "no principal on the page");
    // The operator opens another owner's failed job, with its letter, but not what it recorded.
    let job = console
        .get(&format!("/console/jobs/{theirs}"), &alice)
        .await;
    assert_eq!(job.status, StatusCode::OK);
    assert!(job.body.contains("<h2>Dead letter</h2>") && job.body.contains("mailbox_gone"));
    assert!(job
        .body
        .contains(&format!("POST /v1/dead-letters/{theirs}/replay")));
}

#[tokio::test]
async fn console_letter_actions_need_the_token_preview_and_act_once_confirmed() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let gone = letters_by_hand(&client, "bob", 3, "mail", "mailbox_gone", false).await;
    let kept = letters_by_hand(&client, "bob", 2, "bills", "attempts_exhausted", true).await;
    let bob = console.sign_in(&console.bob).await;
    let csrf = console.get("/console/dead-letters", &bob).await.csrf();
    let open = || async {
        crate::support::count(&client, "etl_dead_letters WHERE replayed_job_id IS NULL").await
    };

    // Every action refuses a missing or wrong token, and a request without a session.
    let actions = [
        "/console/dead-letters/replay".to_owned(),
        "/console/dead-letters/discard".to_owned(),
        format!("/console/dead-letters/{}/replay", kept[0]),
        format!("/console/dead-letters/{}/discard", gone[0]),
    ];
    for path in &actions {
        for (cookies, fields) in [
            (bob.as_str(), format!("csrf={}&confirm=yes", "0".repeat(64))),
            (bob.as_str(), "confirm=yes".to_owned()),
            ("", format!("csrf={csrf}&confirm=yes")),
        ] {
            let refused = console.post(path, cookies, &fields).await;
            assert!(
                [StatusCode::FORBIDDEN, StatusCode::UNPROCESSABLE_ENTITY].contains(&refused.status),
                "{path} {fields}: {}",
                refused.status
            );
        }
    }
    assert_eq!(open().await, 5);

    // A bulk discard of the mail letters: the first POST previews, the second discards.
    let preview = console
        .post(
            "/console/dead-letters/discard",
            &bob,
            &format!("csrf={csrf}&queue=mail"),
        )
        .await;
    assert_eq!(preview.status, StatusCode::OK);
    assert!(
        preview
            .body
            .contains("This will discard <strong>3 letters</strong> (queue=mail)"),
        "{}",
        preview.body
    );
    assert!(preview.body.contains("name=\"confirm\" value=\"yes\""));
    assert_eq!(open().await, 5, "a preview changes nothing");
    let done = console
        .post(
            "/console/dead-letters/discard",
            &bob,
            &format!("csrf={csrf}&queue=mail&confirm=yes"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let location = done.location().to_owned();
    assert_eq!(
        location,
        "/console/dead-letters?queue=mail&done=discarded&n=3"
    );
    assert!(console
        .get(&location, &bob)
        .await
        .body
        .contains("Discarded 3 letters."));
    assert_eq!(open().await, 2);

    // A bulk replay of the rest: the preview says what it takes, the confirmation makes one job
    // each, recorded as asked by the console's key, never the owner.
    let preview = console
        .post(
            "/console/dead-letters/replay",
            &bob,
            &format!("csrf={csrf}"),
        )
        .await;
    assert!(
        preview
            .body
            .contains("This will replay <strong>2 letters</strong>"),
        "{}",
        preview.body
    );
    let done = console
        .post(
            "/console/dead-letters/replay",
            &bob,
            &format!("csrf={csrf}&confirm=yes"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert_eq!(
        done.location(),
        "/console/dead-letters?done=replayed&n=2&left=0"
    );
    assert_eq!(open().await, 0);
    let by: Vec<String> = crate::support::first_column(
        &client,
        "SELECT replayed_by FROM etl_dead_letters WHERE replayed_by IS NOT NULL",
    )
    .await;
    assert_eq!(by.len(), 2);
    for by in by {
        assert!(
            by.starts_with("console:") && Uuid::parse_str(&by[8..]).is_ok(),
            "{by}"
        );
    }
    // Replaying a replayed letter again opens the job its replay made.
    let made: Uuid = client
        .query_one(
            "SELECT replayed_job_id FROM etl_dead_letters WHERE job_id = $1",
            &[&kept[0]],
        )
        .await
        .unwrap()
        .get(0);
    let again = console
        .post(
            &format!("/console/dead-letters/{}/replay", kept[0]),
            &bob,
            &format!("csrf={csrf}&confirm=yes"),
        )
        .await;
    assert_eq!(again.location(), format!("/console/jobs/{made}"));
    assert_eq!(
        console
            .get(&format!("/console/jobs/{made}"), &bob)
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn console_an_owner_replays_or_discards_one_failed_job_from_its_page() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let kept = letters_by_hand(&client, "bob", 1, "bills", "attempts_exhausted", true).await[0];
    let gone = letters_by_hand(&client, "bob", 1, "mail", "mailbox_gone", false).await[0];
    let bob = console.sign_in(&console.bob).await;

    // A retained letter's job page offers a replay; confirmed, it opens the new job.
    let page = console.get(&format!("/console/jobs/{kept}"), &bob).await;
    assert!(
        page.body.contains("Its payload is retained"),
        "{}",
        page.body
    );
    let replay = format!("/console/dead-letters/{kept}/replay");
    assert!(page.body.contains(&format!("action=\"{replay}\"")));
    let csrf = page.csrf();
    let preview = console.post(&replay, &bob, &format!("csrf={csrf}")).await;
    assert_eq!(preview.status, StatusCode::OK);
    assert!(preview.body.contains("Replay 1 letter"));
    assert_eq!(crate::support::count(&client, "etl_job_records").await, 0);
    let done = console
        .post(&replay, &bob, &format!("csrf={csrf}&confirm=yes"))
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let new_job = done.location().to_owned();
    let made = console.get(&new_job, &bob).await;
    assert_eq!(made.status, StatusCode::OK);
    assert!(made.body.contains("status-pending"), "{}", made.body);
    let replayed = console.get(&format!("/console/jobs/{kept}"), &bob).await;
    assert!(
        replayed.body.contains(&format!("href=\"{new_job}\"")),
        "the letter links its replay"
    );

    // A letter without a retained payload: the page says to send the request again through
    // the API, and the console refuses to replay it.
    let page = console.get(&format!("/console/jobs/{gone}"), &bob).await;
    assert!(page
        .body
        .contains(&format!("POST /v1/dead-letters/{gone}/replay")));
    assert!(!page
        .body
        .contains(&format!("action=\"/console/dead-letters/{gone}/replay\"")));
    let refused = console
        .post(
            &format!("/console/dead-letters/{gone}/replay"),
            &bob,
            &format!("csrf={csrf}&confirm=yes"),
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    // Its discard asks first, then discards it and lists what is left.
    let discard = format!("/console/dead-letters/{gone}/discard");
    let preview = console.post(&discard, &bob, &format!("csrf={csrf}")).await;
    assert!(preview.body.contains("Discard 1 letter"));
    let done = console
        .post(&discard, &bob, &format!("csrf={csrf}&confirm=yes"))
        .await;
    assert_eq!(done.location(), "/console/dead-letters?done=discarded&n=1");
    let after = console.get(&format!("/console/jobs/{gone}"), &bob).await;
    assert!(after.body.contains("status-failed") && !after.body.contains("<h2>Dead letter</h2>"));
    let again = console
        .post(&discard, &bob, &format!("csrf={csrf}&confirm=yes"))
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
}

/// The audit log's entries, oldest first: key id, action, target, how many.
async fn audit_log(client: &Client) -> Vec<(Uuid, String, String, i64)> {
    client
        .query(
            "SELECT key_id, action, target, affected FROM etl_audit_log ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Posts the form `fields` (after the session's token `csrf`) to `path` as `session`, and checks
/// that it was taken.
async fn post_taken(console: &Console, path: &str, session: &str, csrf: &str, fields: &str) {
    let answer = console
        .post(path, session, &format!("csrf={csrf}{fields}"))
        .await;
    assert!(
        answer.status.is_success() || answer.status.is_redirection(),
        "{path}"
    );
}

/// Takes every console action on new letters and a new job of bob's as `session` (whose token
/// is `csrf`): previews first (checked to write nothing), then each confirmed. Returns the
/// letters and the job.
async fn act_all(
    console: &Console,
    client: &Client,
    session: &str,
    csrf: &str,
) -> (Vec<Uuid>, Vec<Uuid>, Uuid) {
    let gone = letters_by_hand(client, "bob", 2, "mail", "mailbox_gone", false).await;
    let kept = letters_by_hand(client, "bob", 2, "bills", "attempts_exhausted", true).await;
    let job = console
        .submit(&console.bob, &Uuid::now_v7().to_string(), true)
        .await;
    let (discard, replay, cancel) = (
        format!("/console/dead-letters/{}/discard", gone[0]),
        format!("/console/dead-letters/{}/replay", kept[0]),
        format!("/console/jobs/{job}/cancel"),
    );
    let before = audit_log(client).await;
    post_taken(console, &discard, session, csrf, "").await;
    post_taken(console, "/console/dead-letters/replay", session, csrf, "").await;
    post_taken(console, &cancel, session, csrf, "").await;
    assert_eq!(audit_log(client).await, before, "previews write nothing");
    let confirmed = "&confirm=yes";
    post_taken(console, &discard, session, csrf, confirmed).await;
    post_taken(console, &replay, session, csrf, confirmed).await;
    post_taken(
        console,
        "/console/dead-letters/replay",
        session,
        csrf,
        confirmed,
    )
    .await;
    let queue_mail = "&queue=mail&confirm=yes";
    post_taken(
        console,
        "/console/dead-letters/discard",
        session,
        csrf,
        queue_mail,
    )
    .await;
    post_taken(console, &cancel, session, csrf, confirmed).await;
    (gone, kept, job)
}

#[tokio::test]
async fn console_every_operator_action_writes_one_audit_entry_that_only_operators_read() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let alice_id: Uuid = client
        .query_one("SELECT id FROM etl_api_clients WHERE operator", &[])
        .await
        .unwrap()
        .get(0);
    let bob = console.sign_in(&console.bob).await;
    let alice = console.sign_in(&console.alice).await;
    let bob_csrf = console.get("/console/dead-letters", &bob).await.csrf();
    let alice_csrf = console.get("/console/dead-letters", &alice).await.csrf();
    // An owner's session acting on its own letters and job takes no operator action.
    act_all(&console, &client, &bob, &bob_csrf).await;
    assert!(audit_log(&client).await.is_empty());
    // Each of an operator's confirmed actions writes one entry, with the key's id and no owner.
    let (gone, kept, job) = act_all(&console, &client, &alice, &alice_csrf).await;
    let entry = |action: &str, target: String, n: i64| (alice_id, action.to_owned(), target, n);
    assert_eq!(
        audit_log(&client).await,
        [
            entry("letter_discard", gone[0].to_string(), 1),
            entry("letter_replay", kept[0].to_string(), 1),
            entry("letters_replay", "all letters".to_owned(), 1),
            entry("letters_discard", "queue=mail".to_owned(), 1),
            entry("job_cancel", job.to_string(), 1),
        ]
    );
    // An operator's action through the API is logged beside them, from its source.
    let through_api = letters_by_hand(&client, "bob", 1, "mail", "mailbox_gone", false).await;
    let discarded = console
        .http
        .delete(format!(
            "{}/v1/dead-letters/{}",
            console.base, through_api[0]
        ))
        .bearer_auth(&console.alice)
        .send()
        .await
        .unwrap();
    assert_eq!(discarded.status(), StatusCode::NO_CONTENT);
    let sources: Vec<String> =
        crate::support::first_column(&client, "SELECT source FROM etl_audit_log ORDER BY id").await;
    assert_eq!(
        sources,
        ["console", "console", "console", "console", "console", "api"]
    );

    // The audit page is the operators': another key's session finds no such page.
    assert_eq!(
        console.get("/console/operator/audit", &bob).await.status,
        StatusCode::NOT_FOUND
    );
    let page = console.get("/console/operator/audit", &alice).await;
    assert_eq!(page.status, StatusCode::OK);
    for shown in [
        "letter_discard",
        "letters_replay",
        "queue=mail",
        "job_cancel",
        &alice_id.to_string(),
        &format!("href=\"/console/jobs/{job}\""),
        "<td>console</td>",
        "<td>api</td>",
    ] {
        assert!(page.body.contains(shown), "{shown}: {}", page.body);
    }
    assert!(!page.body.contains("bob"), "no principal");
    assert!(console
        .get("/console/jobs", &alice)
        .await
        .body
        .contains("href=\"/console/operator/audit\""));
}
