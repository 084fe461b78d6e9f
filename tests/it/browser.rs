//! The console in a real browser: headless Chromium (Debian's `chromium`) driven over WebDriver
//! (Debian's `chromium-driver`, which `.ci/run` installs when missing). It signs in with the
//! keyboard only, watches a job submitted through the API reach `succeeded` on its page,
//! cancels a deferred job from the console, checks that the operator view's charts render, and
//! saves a screenshot of each page under `target/console-screenshots/` for review.

use crate::console::Console;
use crate::support::{free_port, pool};
use durable_etl::config::WorkerConfig;
use durable_etl::etl::load::EtlLoad;
use durable_etl::handler::Registry;
use durable_etl::shutdown;
use durable_etl::worker::Worker;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Debian's ChromeDriver.
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Debian's Chromium.
const CHROMIUM: &str = "/usr/bin/chromium";

/// A ChromeDriver process, killed when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts ChromeDriver on a free port and a headless Chromium session through it.
async fn browser() -> (Driver, Client) {
    let port = free_port();
    let driver = Driver(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "chromedriver (Debian's chromium-driver) must be installed: .ci/run installs it",
            ),
    );
    let profile = tempdir("chromium-profile");
    let capabilities = serde_json::json!({
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            // The flags Chromium needs as root on a machine with no network beyond loopback.
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", "--window-size=1280,900",
                     format!("--user-data-dir={}", profile.display())]
        }
    });
    let serde_json::Value::Object(capabilities) = capabilities else {
        unreachable!()
    };
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let mut builder = ClientBuilder::new(connector);
        builder.capabilities(capabilities.clone());
        if let Ok(client) = builder.connect(&url).await {
            return (driver, client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver never answered on {url}");
}

/// A fresh directory under `target/` named after `what`.
fn tempdir(what: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{what}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Saves a screenshot of the current page as `target/console-screenshots/NAME.png`.
async fn screenshot(browser: &Client, name: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("..")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Reloads `url` until its page contains `text` (or fails after 30 s).
async fn until_page_shows(browser: &Client, url: &str, text: &str) -> String {
    for _ in 0..150 {
        browser.goto(url).await.unwrap();
        let source = browser.source().await.unwrap();
        if source.contains(text) {
            return source;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{url} never showed {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_by_keyboard_watches_a_job_succeed_and_cancels_a_deferred_one() {
    let console = Console::start().await;
    let worker = Worker::start(
        pool(&console.db).await,
        &console.db.config,
        WorkerConfig {
            owner_id: "browser".to_owned(),
            poll_interval: Duration::from_millis(200),
            ..WorkerConfig::default()
        },
        Registry::new().register(EtlLoad::default()),
    )
    .await
    .unwrap();
    let (stop, shutdown) = shutdown::manual();
    let running = tokio::spawn(worker.run(shutdown));
    let (_driver, browser) = browser().await;

    // Sign in with the keyboard only: the key field has focus, Enter submits.
    browser
        .goto(&format!("{}/console", console.base))
        .await
        .unwrap();
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/sign-in"));
    screenshot(&browser, "sign-in").await;
    let focused = browser.active_element().await.unwrap();
    assert_eq!(
        focused.attr("id").await.unwrap().as_deref(),
        Some("api_key")
    );
    focused
        .send_keys(&format!("{}{}", console.alice, char::from(Key::Enter)))
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("h1"))
        .await
        .unwrap();
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/jobs"));
    assert_eq!(
        browser
            .find(Locator::Css("h1"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "Jobs"
    );

    // A job submitted through the API reaches `succeeded` on its page.
    let job = console.submit(&console.alice, "browser-1", false).await;
    let page = format!("{}/console/jobs/{job}", console.base);
    let source = until_page_shows(&browser, &page, "status-succeeded").await;
    assert!(source.contains("Rows inserted"));
    screenshot(&browser, "job-succeeded").await;

    // A deferred job is cancelled from the console.
    let deferred = console.submit(&console.alice, "browser-2", true).await;
    let page = format!("{}/console/jobs/{deferred}", console.base);
    browser.goto(&page).await.unwrap();
    browser
        .find(Locator::Css("button.danger"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_page_shows(&browser, &page, "status-cancelled").await;
    screenshot(&browser, "job-cancelled").await;

    browser
        .goto(&format!("{}/console/jobs", console.base))
        .await
        .unwrap();
    let list = browser.source().await.unwrap();
    assert!(list.contains(&job.to_string()) && list.contains(&deferred.to_string()));
    screenshot(&browser, "jobs").await;

    // The operator view (alice's key is an operator's) renders its charts once the replica has
    // reported the job it ran.
    let operator = format!("{}/console/operator", console.base);
    until_page_shows(&browser, &operator, "this minute: 1.0 jobs").await;
    let charts = browser
        .find_all(Locator::Css("svg[role=img]"))
        .await
        .unwrap();
    assert_eq!(charts.len(), 3);
    for chart in charts {
        let (_, _, width, height) = chart.rectangle().await.unwrap();
        assert!(width > 100.0 && height > 50.0, "{width} x {height}");
    }
    screenshot(&browser, "operator").await;
    browser.close().await.unwrap();
    stop.request(durable_etl::shutdown::Stage::Draining);
    running.await.unwrap().unwrap();
}
