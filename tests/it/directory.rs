//! Plain PostgreSQL cells on separate servers, named by a directory: the directory lists the
//! cells and their servers and places owners; every command started with `--directory` finds
//! its cell's server there; an application enqueues each owner's jobs in the owner's cell.

use crate::console;
use crate::support::{
    binary, count, eventually, free_port, post_load, spawn_replica_logged, Cluster, TestDb,
};
use durable_etl::{directory, Jobs, Secret};
use std::collections::BTreeMap;
use std::process::{Child, Output, Stdio};

/// The secret owners are digested with, here and in the binary's commands.
pub(crate) const SECRET: &str = "directory-secret-0123456789";

/// A job of the shipped no-op kind.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ping {
    /// Which one.
    n: i64,
}

impl durable_etl::Job for Ping {
    const KIND: &'static str = durable_etl::job::handler::NOOP_KIND;
}

/// A replica process, killed when dropped.
pub(crate) struct Running(pub(crate) Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the binary with `args` on the directory at `url`, its secret [`SECRET`].
pub(crate) fn run(url: &str, args: &[&str]) -> Output {
    binary(url, args)
        .env("DURABLE_ETL_SECRET", SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Runs the binary with `args` and returns its standard output, asserting it succeeded.
pub(crate) fn ok(url: &str, args: &[&str]) -> String {
    let out = run(url, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_on_two_servers_run_the_jobs_of_the_owners_the_directory_places_in_them() {
    let cells = TwoCells::start().await;
    let (db, url, port) = (&cells.db, cells.url.as_str(), cells.port.as_str());
    let far_cell = cells.session("cell_far").await;
    let near_cell = cells.session("cell_near").await;
    let only_far = "pg_namespace WHERE nspname = 'cell_far'";
    assert_eq!(count(&far_cell, only_far).await, 1);
    assert_eq!(count(&near_cell, only_far).await, 0);
    let owners = owners_of_each_cell(url);

    // Replicas of each cell, given the directory's URL (the poll is a minute away).
    let _replicas = replicas_of_each_cell(url);

    // The application enqueues each owner's job in the owner's cell, found in the directory.
    let secret = Secret::new(SECRET).unwrap();
    let directory_session = db.client().await;
    for (cell, owner) in &owners {
        let jobs = Jobs::new(secret.clone(), owner);
        let found = directory::place(&directory_session, &jobs.owner_key())
            .await
            .unwrap();
        assert_eq!(&found, cell);
        let entry = directory::cell(&directory_session, &found).await.unwrap();
        let config = entry.config(&db.config).unwrap();
        let session = durable_etl::db::connect(&config, "app").await.unwrap();
        jobs.enqueue(&session, &Ping { n: 1 }, Default::default())
            .await
            .unwrap();
    }
    eventually("each cell ran its owner's job", || async {
        count(&far_cell, "etl_jobs WHERE status = 'succeeded'").await == 1
            && count(&near_cell, "etl_jobs WHERE status = 'succeeded'").await == 1
    })
    .await;
    assert_eq!(count(&far_cell, "etl_jobs").await, 1);
    assert_eq!(count(&near_cell, "etl_jobs").await, 1);

    let listed = ok(url, &["cells", "list"]);
    let far_line = listed.lines().find(|l| l.starts_with("cell_far")).unwrap();
    assert!(far_line.contains(&format!("127.0.0.1:{port}")), "{listed}");
    assert!(listed.lines().count() == 3, "{listed}");

    // What the directory cannot answer is refused, exit 2, naming why, and changes nothing.
    for (args, why) in [
        (&["work", "--directory"][..], "--directory finds the server"),
        (
            &["work", "--directory", "--cell", "cell_gone"],
            "no cell of that name",
        ),
        (
            &["cells", "list", "--cell", "cell_near"],
            "the cells commands take neither",
        ),
        (
            &["cells", "add", "cell_near"],
            "a cell of that name already",
        ),
        (&["cells", "close", "cell_gone"], "no cell of that name"),
    ] {
        let refused = run(url, args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    assert_eq!(ok(url, &["cells", "list"]), listed);
    let empty = TestDb::empty().await;
    let missing = run(&empty.config.url, &["cells", "list"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cells init"));
    ok(url, &["cells", "close", "cell_near"]);
    let closed = ok(url, &["cells", "list"]);
    assert!(closed
        .lines()
        .any(|l| l.starts_with("cell_near") && l.contains(" no ")));
    ok(url, &["cells", "open", "cell_near"]);
}

/// Two cells named by a directory: the directory and `cell_near` on the suite's server,
/// `cell_far` on a server of its own, in a database of the same name (commands keep their URL's
/// database and role); both migrated with `--directory`.
pub(crate) struct TwoCells {
    /// The directory's (and the near cell's) database.
    pub(crate) db: TestDb,
    /// The far cell's server.
    pub(crate) far: Cluster,
    /// The directory's URL.
    pub(crate) url: String,
    /// The far server's port.
    pub(crate) port: String,
}

impl TwoCells {
    /// Builds them.
    pub(crate) async fn start() -> TwoCells {
        let db = TestDb::migrated().await;
        let url = db.config.url.clone();
        let far = Cluster::start();
        connect_to(&far, "postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE \"{}\"", db.name))
            .await
            .unwrap();
        let port = far.port().to_string();
        ok(&url, &["cells", "init"]);
        ok(&url, &["cells", "add", "cell_near"]);
        let far_cell = ["cells", "add", "cell_far", "--host", "127.0.0.1", "--port"];
        ok(&url, &[&far_cell[..], &[&port]].concat());
        for cell in ["cell_near", "cell_far"] {
            ok(&url, &["migrate", "--directory", "--cell", cell]);
        }
        TwoCells { db, far, url, port }
    }

    /// A session of `cell` (`cell_near` or `cell_far`), on its server.
    pub(crate) async fn session(&self, cell: &str) -> tokio_postgres::Client {
        let client = match cell {
            "cell_far" => connect_to(&self.far, &self.db.name).await,
            _ => self.db.client().await,
        };
        in_cell(client, cell).await
    }
}

/// One owner of each cell, by cell, placed by `cells place` on the directory at `url`.
pub(crate) fn owners_of_each_cell(url: &str) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for i in 0..64 {
        let owner = format!("tenant-{i}");
        let placed = ok(url, &["cells", "place", "--owner", &owner]);
        owners.entry(placed.trim().to_owned()).or_insert(owner);
        if owners.len() == 2 {
            break;
        }
    }
    assert_eq!(owners.len(), 2, "{owners:?}");
    owners
}

/// A replica of each cell, given the directory's URL `url` (the poll is a minute away).
pub(crate) fn replicas_of_each_cell(url: &str) -> Vec<Running> {
    ["cell_near", "cell_far"]
        .iter()
        .map(|cell| {
            let args = ["--directory", "--cell", cell, "--poll-interval", "60s"];
            Running(spawn_replica_logged(
                url,
                &format!("r-{cell}"),
                &args,
                Stdio::null(),
                "warn",
            ))
        })
        .collect()
}

/// A plain session on database `name` of `cluster`.
async fn connect_to(cluster: &Cluster, name: &str) -> tokio_postgres::Client {
    crate::support::connect(&cluster.url(name).parse().unwrap()).await
}

/// `client`'s session moved into cell `cell`.
async fn in_cell(client: tokio_postgres::Client, cell: &str) -> tokio_postgres::Client {
    client
        .batch_execute(&format!("SET search_path = {cell}"))
        .await
        .unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_api_serves_every_cell_each_request_in_its_key_owners_cell() {
    let cells = TwoCells::start().await;
    let url = cells.url.as_str();
    let owners = owners_of_each_cell(url);

    // Keys made through the directory: each stored in its owner's cell only, and routed there.
    let keys = routed_keys(url, &owners);
    let far_cell = cells.session("cell_far").await;
    let near_cell = cells.session("cell_near").await;
    for session in [&far_cell, &near_cell] {
        assert_eq!(count(session, "etl_api_clients").await, 1);
    }
    // A key stored in a cell by the cell's own command is not routed by the directory.
    let unrouted = ok(
        url,
        &[
            "api-keys",
            "create",
            "--directory",
            "--cell",
            "cell_far",
            "--owner",
            "x",
        ],
    );
    let unrouted = unrouted
        .lines()
        .find_map(|l| l.strip_prefix("key:"))
        .unwrap()
        .trim()
        .to_owned();

    let _replicas = replicas_of_each_cell(url);
    let (addr, _api) = routed_api(url).await;
    let (base, http) = (format!("http://{addr}"), no_redirects());
    // Each owner submits through the one API: the job lands in its owner's cell, whose replica
    // (polling once a minute) runs it. The second round finds the replicas idle: the API's
    // notifier of each cell wakes that cell's replica.
    let mut monitors = BTreeMap::new();
    for round in 1..=2 {
        for (cell, (_, key)) in &keys {
            let records = vec![serde_json::json!({"id": format!("{cell}-{round}")})];
            let idempotency = format!("routed-{round}");
            let response = post_load(&http, &addr, key, &idempotency, records)
                .await
                .unwrap();
            assert_eq!(response.status(), 202, "{cell}");
            let location = response.headers()["location"].to_str().unwrap().to_owned();
            monitors.insert(cell.clone(), location);
        }
        eventually("each cell to run its own owner's job", || async {
            let done = "etl_jobs WHERE status = 'succeeded'";
            count(&far_cell, done).await == round && count(&near_cell, done).await == round
        })
        .await;
    }
    for (session, cell) in [(&far_cell, "cell_far"), (&near_cell, "cell_near")] {
        assert_eq!(count(session, "etl_jobs").await, 2);
        let rows = format!("etl_target_rows WHERE record_key LIKE '{cell}-_'");
        assert_eq!(count(session, &rows).await, 2, "{cell}");
        assert_eq!(count(session, "etl_target_rows").await, 2, "{cell}");
    }

    // Each monitor answers its owner, and is no job at all to the other owner.
    let status = |location: &str, key: &str| {
        let request = http.get(format!("{base}{location}")).bearer_auth(key);
        async move { request.send().await.unwrap() }
    };
    for (cell, location) in &monitors {
        for (other, (_, key)) in &keys {
            let answer = status(location, key).await;
            if other == cell {
                assert_eq!(answer.status(), 200);
                let body: serde_json::Value = answer.json().await.unwrap();
                assert_eq!(body["status"], "succeeded", "{body}");
            } else {
                assert_eq!(answer.status(), 404);
            }
        }
    }
    // Keys the directory does not route are unknown keys.
    let near_monitor = &monitors["cell_near"];
    for key in ["detl_nobody", unrouted.as_str()] {
        assert_eq!(status(near_monitor, key).await.status(), 401);
    }

    // The console signs in through the directory too, and shows its owner's job only.
    let (far_id, far_key) = &keys["cell_far"];
    let signed = console::post_sign_in(&http, &base, far_key).await;
    assert_eq!(signed.status, 303);
    let session = format!("detl_session={}", signed.cookie("detl_session").unwrap());
    let jobs = console::get_page(&http, &base, "/console/jobs", &session).await;
    assert_eq!(jobs.status, 200);
    let job_id = |cell: &str| monitors[cell].rsplit('/').next().unwrap().to_owned();
    assert!(jobs.body.contains(&job_id("cell_far")));
    assert!(!jobs.body.contains(&job_id("cell_near")));
    let refused = console::post_sign_in(&http, &base, &unrouted).await;
    assert!(refused.cookie("detl_session").is_none());

    // Revoked through the directory, in its cell: refused at once, by the API and the console.
    ok(url, &["api-keys", "revoke", "--directory", far_id]);
    assert_eq!(status(&monitors["cell_far"], far_key).await.status(), 401);
    let after = console::get_page(&http, &base, "/console/jobs", &session).await;
    assert_eq!(after.status, 303);
    let unknown = run(
        url,
        &[
            "api-keys",
            "revoke",
            "--directory",
            &uuid::Uuid::nil().to_string(),
        ],
    );
    assert_eq!(unknown.status.code(), Some(1), "no live key");
    assert_eq!(
        status(&monitors["cell_near"], &keys["cell_near"].1)
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_api_answers_503_to_the_owners_of_a_cell_whose_server_is_down_and_shows_it_to_operators(
) {
    let cells = TwoCells::start().await;
    let url = cells.url.as_str();
    let keys = routed_keys(url, &owners_of_each_cell(url));
    let (addr, _api) = routed_api(url).await;
    let http = no_redirects();
    let list = |key: &str| {
        let request = http
            .get(format!("http://{addr}/v1/etl-jobs"))
            .bearer_auth(key);
        async move { request.send().await.unwrap() }
    };
    let (far_key, near_key) = (&keys["cell_far"].1, &keys["cell_near"].1);

    let operator = operator_key_in(url, "cell_near");
    let cells_view = || {
        let request = http
            .get(format!("http://{addr}/v1/cells"))
            .bearer_auth(&operator);
        async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), 200);
            answer.json::<serde_json::Value>().await.unwrap()["cells"].clone()
        }
    };
    // Only operators see the cells.
    let asked = http
        .get(format!("http://{addr}/v1/cells"))
        .bearer_auth(near_key);
    assert_eq!(asked.send().await.unwrap().status(), 404);
    // An operator's queue view reads its own cell, or the cell it names.
    cells
        .session("cell_far")
        .await
        .batch_execute("INSERT INTO etl_queues (queue, paused) VALUES ('far_only', true)")
        .await
        .unwrap();
    let queues = |key: &str, path: &str| {
        let request = http.get(format!("http://{addr}{path}")).bearer_auth(key);
        async move { request.send().await.unwrap() }
    };
    let names = |listed: serde_json::Value| -> Vec<String> {
        let queues = listed["queues"].as_array().cloned().unwrap_or_default();
        queues
            .iter()
            .map(|q| q["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let own = queues(&operator, "/v1/queues").await;
    assert_eq!(own.status(), 200);
    assert!(!names(own.json().await.unwrap()).contains(&"far_only".to_owned()));
    let far = queues(&operator, "/v1/queues?cell=cell_far").await;
    assert_eq!(far.status(), 200);
    assert!(names(far.json().await.unwrap()).contains(&"far_only".to_owned()));
    let one = queues(&operator, "/v1/queues/far_only?cell=cell_far").await;
    assert_eq!(one.status(), 200);
    for (key, path) in [
        (operator.as_str(), "/v1/queues?cell=cell_gone"),
        (operator.as_str(), "/v1/queues?cell=Not%20a%20cell"),
        (operator.as_str(), "/v1/queues/far_only"),
        (near_key.as_str(), "/v1/queues?cell=cell_far"),
    ] {
        assert_eq!(queues(key, path).await.status(), 404, "{path}");
    }
    let garbled = queues(&operator, "/v1/queues?cell=cell_far&cell=cell_near").await;
    assert_eq!(garbled.status(), 400);
    let problem: serde_json::Value = garbled.json().await.unwrap();
    assert_eq!(problem["code"], "query_invalid");

    // The far cell's server is down before any request opened the cell: its owner's requests
    // answer 503 (the cell is not opened), the near owner's are served, and the operators' view
    // shows the far cell unreachable beside the near one's figures.
    cells.far.pg_ctl(&["-m", "fast", "stop"]);
    let refused = list(far_key).await;
    assert_eq!(refused.status(), 503);
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "database_unavailable", "{problem}");
    assert_eq!(list(near_key).await.status(), 200);
    let seen = cells_view().await;
    assert_eq!(seen[0]["name"], "cell_far", "{seen}");
    assert_eq!(seen[0]["up"], false, "{seen}");
    assert!(seen[0]["running"].is_null(), "{seen}");
    assert_eq!(seen[1]["name"], "cell_near", "{seen}");
    assert_eq!(seen[1]["up"], true, "{seen}");
    assert_eq!(seen[1]["pending_due"], 0, "{seen}");
    assert!(seen[1]["owners"].as_i64().unwrap() >= 2, "{seen}");
    let base = format!("http://{addr}");
    let signed = console::post_sign_in(&http, &base, &operator).await;
    let session = format!("detl_session={}", signed.cookie("detl_session").unwrap());
    let page = console::get_page(&http, &base, "/console/operator", &session).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("cell_far") && page.body.contains("unreachable"));

    // Back up: the next request opens the cell.
    cells.far.pg_ctl(&["start"]);
    eventually("the far cell to be served again", || async {
        list(far_key).await.status() == 200
    })
    .await;
    assert_eq!(list(near_key).await.status(), 200);
    assert_eq!(cells_view().await[0]["up"], true);
    let page = console::get_page(&http, &base, "/console/operator", &session).await;
    assert!(!page.body.contains("unreachable"));

    // A routed API's metrics are its own counters: no cell's figures.
    let metrics = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    let served = "durable_etl_http_responses_total{class=\"2xx\"}";
    assert!(metrics.contains(served), "{metrics}");
    assert!(
        !metrics.contains("durable_etl_pool_connections"),
        "{metrics}"
    );
}

/// An API key of each owner of `owners` (by cell), made through the directory at `url`: its id
/// and the key, by cell. Asserts the command names the owner's cell.
pub(crate) fn routed_keys(
    url: &str,
    owners: &BTreeMap<String, String>,
) -> BTreeMap<String, (String, String)> {
    let mut keys = BTreeMap::new();
    for (cell, owner) in owners {
        let out = ok(
            url,
            &["api-keys", "create", "--directory", "--owner", owner],
        );
        let field = |name: &str| {
            let line = out.lines().find_map(|l| l.strip_prefix(name));
            line.unwrap().trim().to_owned()
        };
        assert_eq!(&field("cell:"), cell, "{out}");
        keys.insert(cell.clone(), (field("id:"), field("key:")));
    }
    keys
}

/// An operator's API key made through the directory at `url` for an owner placed in `cell`.
fn operator_key_in(url: &str, cell: &str) -> String {
    for i in 0..64 {
        let owner = format!("operator-{i}");
        let args = [
            "api-keys",
            "create",
            "--directory",
            "--operator",
            "--owner",
            &owner,
        ];
        let out = ok(url, &args);
        if out
            .lines()
            .any(|l| l.strip_prefix("cell:").map(str::trim) == Some(cell))
        {
            let key = out.lines().find_map(|l| l.strip_prefix("key:"));
            return key.unwrap().trim().to_owned();
        }
    }
    panic!("no operator placed in {cell}");
}

/// An API serving every cell of the directory at `url` (`serve --directory`), once ready: its
/// address, and the process.
pub(crate) async fn routed_api(url: &str) -> (String, Running) {
    let addr = format!("127.0.0.1:{}", free_port());
    let api = binary(url, &["serve", "--directory", "--listen", &addr])
        .env("DURABLE_ETL_SECRET", SECRET)
        .spawn()
        .unwrap();
    let api = Running(api);
    let http = no_redirects();
    eventually("the routed API to be ready", || async {
        let ready = http.get(format!("http://{addr}/readyz")).send().await;
        ready.is_ok_and(|r| r.status() == 200)
    })
    .await;
    (addr, api)
}

/// An HTTP client that does not follow redirects.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}
