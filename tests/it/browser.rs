//! The console in a real browser: headless Chromium (Debian's `chromium`) driven over WebDriver
//! (Debian's `chromium-driver`, which `.ci/run` installs when missing). It signs in with the
//! keyboard only, watches a job submitted through the API reach `succeeded` on its open page
//! (refreshed in place by the live-refresh script),
//! cancels a deferred job from the console, checks that the operator view's charts render, checks
//! each page's accessibility basics (text contrast measured on the rendered page, labelled
//! controls, headings in order), and saves a screenshot of each page under
//! `target/console-screenshots/` for review. With `DURABLE_ETL_UPDATE_DOC_IMAGES` set, it also
//! writes the screenshots the docs show (`docs/images/console-NAME.png`), so the docs' pictures
//! are always this test's; every such picture must be one it takes.

use crate::console::Console;
use crate::support::free_port;
use durable_etl::worker::completer;
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

/// Checks the current page's accessibility basics, then saves a screenshot of it as
/// `target/console-screenshots/NAME.png`.
async fn screenshot(browser: &Client, name: &str) {
    assert_accessible(browser, name).await;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("..")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
    let shown = doc_images().join(format!("console-{name}.png"));
    if std::env::var_os("DURABLE_ETL_UPDATE_DOC_IMAGES").is_some() && shown.exists() {
        std::fs::write(shown, png).unwrap();
    }
}

/// Where the docs keep their pictures.
fn doc_images() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/images")
}

/// The pages this test screenshots, by name.
const SCREENSHOTS: &[&str] = &[
    "sign-in",
    "job-pending",
    "job-succeeded",
    "cancel-confirm",
    "job-cancelled",
    "job-retrying",
    "jobs",
    "operator",
    "operator-charts",
    "queues",
    "queue",
    "failures",
    "audit",
    "dead-letters",
    "bulk-confirm",
    "letter-job",
];

/// Every console picture the docs show is one this test takes (and so can regenerate).
#[test]
fn every_console_picture_in_the_docs_is_a_page_this_test_screenshots() {
    let pictures: Vec<String> = std::fs::read_dir(doc_images())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("console-"))
        .collect();
    assert!(!pictures.is_empty());
    for picture in pictures {
        let name = picture
            .trim_start_matches("console-")
            .trim_end_matches(".png");
        assert!(
            SCREENSHOTS.contains(&name),
            "{picture} is no page the test screenshots"
        );
    }
    let source =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file!())).unwrap();
    for name in SCREENSHOTS {
        let taken = format!("screenshot(&browser, \"{name}\")");
        assert!(source.contains(&taken), "{name} is never screenshotted");
    }
}

/// Reloads `url` until its page contains one of `texts` (or fails after 30 s).
async fn until_page_shows(browser: &Client, url: &str, texts: &[&str]) -> String {
    for _ in 0..150 {
        browser.goto(url).await.unwrap();
        let source = browser.source().await.unwrap();
        if texts.iter().any(|text| source.contains(text)) {
            return source;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{url} never showed any of {texts:?}");
}

/// Run in the page: every element with text of its own whose contrast ratio against its
/// effective background (the first opaque background of it or an ancestor; white if none) is
/// under WCAG AA's 4.5:1 (3:1 for large text), every form control without a label, and every
/// heading that skips a level or a page without exactly one `h1`. Returns the findings as
/// strings (none: the page passes).
const ACCESSIBILITY_SCRIPT: &str = r#"
const rgb = (css) => (css.match(/[\d.]+/g) || []).map(Number);
const luminance = ([r, g, b]) => {
  const lin = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
};
const background = (el) => {
  for (; el; el = el.parentElement) {
    const c = rgb(getComputedStyle(el).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
const findings = [];
for (const el of document.querySelectorAll("body *")) {
  if (el.closest("svg, script, style")) continue;
  const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim() !== "");
  const style = getComputedStyle(el);
  if (!own || style.visibility === "hidden" || style.display === "none") continue;
  const [fg, bg] = [luminance(rgb(style.color).slice(0, 3)), luminance(background(el))];
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  const size = parseFloat(style.fontSize);
  const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
  if (ratio < (large ? 3 : 4.5)) {
    findings.push(`contrast ${ratio.toFixed(2)} of <${el.tagName.toLowerCase()} class="${el.className}">`);
  }
}
for (const el of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
  if (el.labels.length === 0 && !el.getAttribute("aria-label")) findings.push(`unlabelled ${el.name}`);
}
const levels = [...document.querySelectorAll("h1, h2, h3, h4, h5, h6")].map((h) => Number(h.tagName[1]));
if (levels.filter((l) => l === 1).length !== 1 || levels[0] !== 1) findings.push(`headings ${levels}`);
levels.forEach((l, i) => { if (i > 0 && l > levels[i - 1] + 1) findings.push(`heading skips to h${l}`); });
return findings;
"#;

/// Asserts that the open page (`what`) passes [`ACCESSIBILITY_SCRIPT`]'s checks.
async fn assert_accessible(browser: &Client, what: &str) {
    let findings = browser.execute(ACCESSIBILITY_SCRIPT, vec![]).await.unwrap();
    assert_eq!(findings, serde_json::json!([]), "{what}");
}

/// Waits, without navigating, until the open page contains `text` (or fails after 30 s).
async fn until_live_page_shows(browser: &Client, text: &str) -> String {
    for _ in 0..150 {
        let source = browser.source().await.unwrap();
        if source.contains(text) {
            return source;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the open page never showed {text}");
}

/// Waits until the open page (which reloads itself) no longer shows `text` (or fails after 30 s).
async fn until_live_page_drops(browser: &Client, text: &str) {
    for _ in 0..150 {
        if !browser.source().await.unwrap().contains(text) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the open page kept showing {text}");
}

/// Signs in on the open sign-in page with the keyboard only: the key field has focus, typing
/// `key` and Enter submits it; waits for the next page's heading.
async fn sign_in_by_keyboard(browser: &Client, key: &str) {
    let focused = browser.active_element().await.unwrap();
    assert_eq!(
        focused.attr("id").await.unwrap().as_deref(),
        Some("api_key")
    );
    focused
        .send_keys(&format!("{key}{}", char::from(Key::Enter)))
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("h1"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_by_keyboard_watches_a_job_succeed_and_cancels_a_deferred_one() {
    let console = Console::start().await;
    // A job whose first attempt failed transiently, waiting an hour for its retry (claimed and
    // retried before the replica starts, so the replica cannot take it first).
    let retrying = console.submit(&console.alice, "browser-0", false).await;
    let client = console.db.client().await;
    let lease = crate::console_history::claim(&client).await;
    let retried = completer::retry(&client, lease, Duration::from_secs(3600)).await;
    assert_eq!(retried.unwrap(), completer::Transition::Retried);
    let replica = console.replica("browser").await;
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
    sign_in_by_keyboard(&browser, &console.alice).await;
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

    // A job submitted through the API, due in six seconds, reaches `succeeded` on its page
    // while the page stays open: the live-refresh script swaps the new state in, with no reload
    // (a mark left on the page's window survives).
    let job = console
        .submit_due_in(
            &console.alice,
            "browser-1",
            Some(chrono::Duration::seconds(6)),
        )
        .await;
    let page = format!("{}/console/jobs/{job}", console.base);
    browser.goto(&page).await.unwrap();
    assert!(browser.source().await.unwrap().contains("status-pending"));
    screenshot(&browser, "job-pending").await;
    browser
        .execute(
            "window.durableEtlMark = 'not reloaded'; return null;",
            vec![],
        )
        .await
        .unwrap();
    let source = until_live_page_shows(&browser, "status-succeeded").await;
    assert!(source.contains("rows inserted"));
    let mark = browser
        .execute("return window.durableEtlMark;", vec![])
        .await
        .unwrap();
    assert_eq!(mark, "not reloaded", "the page was refreshed in place");
    screenshot(&browser, "job-succeeded").await;

    // A deferred job is cancelled from the console, once the cancel is confirmed.
    let deferred = console.submit(&console.alice, "browser-2", true).await;
    let page = format!("{}/console/jobs/{deferred}", console.base);
    browser.goto(&page).await.unwrap();
    let heading = follow(&browser, Locator::Css("button.danger")).await;
    assert_eq!(heading, "Cancel job");
    screenshot(&browser, "cancel-confirm").await;
    browser
        .find(Locator::Css("button#confirm"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_page_shows(&browser, &page, &["status-cancelled"]).await;
    screenshot(&browser, "job-cancelled").await;

    // The waiting job's timeline shows its first attempt and when its retry is due.
    browser
        .goto(&format!("{}/console/jobs/{retrying}", console.base))
        .await
        .unwrap();
    let source = browser.source().await.unwrap();
    assert!(
        source.contains("Attempt 1 failed transiently") && source.contains("retry scheduled at")
    );
    screenshot(&browser, "job-retrying").await;

    browser
        .goto(&format!("{}/console/jobs", console.base))
        .await
        .unwrap();
    let list = browser.source().await.unwrap();
    assert!(list.contains(&job.to_string()) && list.contains(&deferred.to_string()));
    screenshot(&browser, "jobs").await;

    // The list refreshes every 5 s, but never from under a reader whose focus is on a job link;
    // once the focus leaves, it does (a mark on the served `main` goes with it).
    let focus_and_mark = "document.querySelector('main').dataset.mark = 'served'; \
                          document.querySelector('main a.id').focus(); \
                          return document.activeElement.getAttribute('href');";
    let focused = browser.execute(focus_and_mark, vec![]).await.unwrap();
    assert!(focused
        .as_str()
        .is_some_and(|href| href.starts_with("/console/jobs/")));
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let kept = "return [document.activeElement.getAttribute('href'), \
                        document.querySelector('main').dataset.mark || null];";
    let state = browser.execute(kept, vec![]).await.unwrap();
    assert_eq!(
        state,
        serde_json::json!([focused, "served"]),
        "focus kept, not refreshed"
    );
    browser
        .execute("document.activeElement.blur(); return null;", vec![])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let state = browser.execute(kept, vec![]).await.unwrap();
    assert_eq!(
        state[1],
        serde_json::Value::Null,
        "refreshed once the focus left"
    );

    // The operator view (alice's key is an operator's) renders its charts once the replica has
    // reported the job it ran: in this minute's bar, or the last one's when the minute turned
    // since the job ran.
    let operator = format!("{}/console/operator", console.base);
    let ran = [
        "default 1 in the hour, at most 1 jobs a minute",
        "p50 last ",
        "due last ",
    ];
    until_page_shows(&browser, &operator, &ran).await;
    let charts = browser
        .find_all(Locator::Css("svg[role=img]"))
        .await
        .unwrap();
    assert_eq!(charts.len(), 6);
    let lines = browser
        .find_all(Locator::Css("svg polyline, svg circle"))
        .await
        .unwrap();
    assert!(
        lines.len() >= 3,
        "the finished jobs', the pickup latency's and the backlog's time series are drawn"
    );
    for chart in charts {
        let (_, _, width, height) = chart.rectangle().await.unwrap();
        assert!(width > 100.0 && height > 50.0, "{width} x {height}");
    }
    screenshot(&browser, "operator").await;
    // The charts, below the fold: the page scrolled to "The last hour".
    browser
        .execute(
            "[...document.querySelectorAll('h2')].find(h => h.textContent === 'The last hour')\
             .scrollIntoView()",
            vec![],
        )
        .await
        .unwrap();
    screenshot(&browser, "operator-charts").await;
    browser.close().await.unwrap();
    replica.stop().await;
}

/// Clicks the link `link` finds on the open page; returns the heading of the page it opens.
async fn follow(browser: &Client, link: Locator<'_>) -> String {
    let from = browser.current_url().await.unwrap();
    browser.find(link).await.unwrap().click().await.unwrap();
    for _ in 0..150 {
        if browser.current_url().await.unwrap() != from {
            let heading = browser
                .wait()
                .for_element(Locator::Css("h1"))
                .await
                .unwrap();
            return heading.text().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the link from {from} never opened a page");
}

/// Whether `text` is a relative time as the console writes one: `now`, `in 2 min`, `3 s ago`.
fn is_relative(text: &str) -> bool {
    let span = |s: &str| {
        s.split_once(' ').is_some_and(|(n, unit)| {
            n.parse::<u64>().is_ok() && ["s", "min", "h", "d"].contains(&unit)
        })
    };
    text == "now"
        || text.strip_prefix("in ").is_some_and(span)
        || text.strip_suffix(" ago").is_some_and(span)
}

/// Asserts that the open page shows at least one time, and every time it shows is relative
/// with its absolute UTC instant as its `datetime` and `title`.
async fn assert_relative_times(browser: &Client) {
    let script = "return [...document.querySelectorAll('main time')]
                    .map((t) => [t.getAttribute('datetime'), t.title, t.textContent]);";
    let times = browser.execute(script, vec![]).await.unwrap();
    let times = times.as_array().unwrap();
    assert!(!times.is_empty(), "no time shown");
    for time in times {
        let (datetime, title, text) = (&time[0], &time[1], time[2].as_str().unwrap());
        assert!(
            datetime.as_str().unwrap().ends_with('Z') && datetime == title,
            "{time}"
        );
        assert!(is_relative(text), "{time}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_goes_from_the_operator_view_to_the_queues_and_the_jobs_behind_them() {
    let console = Console::start().await;
    let client = console.db.client().await;
    durable_etl::queue::set_cap(&client, "default", Some(4))
        .await
        .unwrap();
    let deferred = console.submit(&console.bob, "browser-queue-0", true).await;
    let failed = console.submit(&console.bob, "browser-queue-1", true).await;
    crate::support::end_job(&client, failed, "failed", Some("handler_failed"), None).await;
    let (_driver, browser) = browser().await;
    browser
        .goto(&format!("{}/console/sign-in", console.base))
        .await
        .unwrap();
    sign_in_by_keyboard(&browser, &console.alice).await;

    // From the operator view to the queues, by their link.
    browser
        .goto(&format!("{}/console/operator", console.base))
        .await
        .unwrap();
    let heading = follow(&browser, Locator::LinkText("All queues, with their jobs")).await;
    assert_eq!(heading, "Queues");
    let source = browser.source().await.unwrap();
    assert!(source.contains("0 of 4 held (0%)"), "{source}");
    screenshot(&browser, "queues").await;

    // From a queue to its jobs: metadata only, every time relative with its instant kept.
    let link = Locator::Css("a[href='/console/queues/default']");
    assert_eq!(follow(&browser, link).await, "Queue default");
    let jobs = browser.find_all(Locator::Css("main a.id")).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].text().await.unwrap(), deferred.to_string());
    let source = browser.source().await.unwrap();
    assert!(
        !source.contains(&failed.to_string()),
        "an ended job is no live job"
    );
    assert!(!source.contains("canary"), "no payload");
    assert_relative_times(&browser).await;
    screenshot(&browser, "queue").await;

    // The queue's controls: pause it, then cap it at 2, from its page.
    let pause = Locator::Css("main form[action$='/pause'] button");
    browser.find(pause).await.unwrap().click().await.unwrap();
    let source = until_live_page_shows(&browser, "Resume queue").await;
    assert!(source.contains("<td>paused</td>"));
    let cap = browser.find(Locator::Id("cap")).await.unwrap();
    cap.clear().await.unwrap();
    cap.send_keys("2").await.unwrap();
    let set = Locator::Css("main form[action$='/cap'] button");
    browser.find(set).await.unwrap().click().await.unwrap();
    until_live_page_shows(&browser, "0 of 2 held (0%)").await;
    // A key cap of 1; then the cap lifted (an empty value) and the queue resumed.
    let key_cap = browser.find(Locator::Id("key_cap")).await.unwrap();
    key_cap.clear().await.unwrap();
    key_cap.send_keys("1").await.unwrap();
    let set_key = Locator::Css("main form[action$='/key-cap'] button");
    browser.find(set_key).await.unwrap().click().await.unwrap();
    until_live_page_shows(&browser, "1 per key, 0 held").await;
    browser
        .find(Locator::Id("cap"))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();
    browser.find(set).await.unwrap().click().await.unwrap();
    until_live_page_drops(&browser, "of 2 held").await;
    let resume = Locator::Css("main form[action$='/resume'] button");
    browser.find(resume).await.unwrap().click().await.unwrap();
    let source = until_live_page_shows(&browser, "Pause queue").await;
    assert!(!source.contains("<td>paused</td>"), "{source}");

    // An operator opens another owner's job from the queue's jobs.
    let link = format!("main a[href='/console/jobs/{deferred}']");
    let heading = follow(&browser, Locator::Css(&link)).await;
    assert_eq!(heading, format!("Job {deferred}"));
    browser.back().await.unwrap();

    // From a failure code to the jobs that ended with it.
    browser
        .goto(&format!("{}/console/failures/handler_failed", console.base))
        .await
        .unwrap();
    let shown = browser.find_all(Locator::Css("main a.id")).await.unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].text().await.unwrap(), failed.to_string());
    assert_relative_times(&browser).await;
    screenshot(&browser, "failures").await;

    // The audit log, from the header.
    let heading = follow(&browser, Locator::LinkText("Audit")).await;
    assert_eq!(heading, "Audit");
    let source = browser.source().await.unwrap();
    assert!(
        [
            "queue_pause",
            "default cap=2",
            "default key_cap=1",
            "default cap=none",
            "queue_resume"
        ]
        .iter()
        .all(|entry| source.contains(entry)),
        "{source}"
    );
    screenshot(&browser, "audit").await;
    browser.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_filters_dead_letters_and_replays_and_discards_them_once_confirmed() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let by_hand = crate::console_letters::letters_by_hand;
    let gone = by_hand(&client, "bob", 3, "mail", "mailbox_gone", false).await;
    let kept = by_hand(&client, "bob", 2, "bills", "attempts_exhausted", true).await;
    let (_driver, browser) = browser().await;
    browser
        .goto(&format!("{}/console/sign-in", console.base))
        .await
        .unwrap();
    sign_in_by_keyboard(&browser, &console.bob).await;

    // From the navigation to the letters, their counts and their times.
    let heading = follow(&browser, Locator::LinkText("Dead letters")).await;
    assert_eq!(heading, "Dead letters");
    let source = browser.source().await.unwrap();
    assert!(source.contains("5 open letters match."), "{source}");
    assert_relative_times(&browser).await;
    screenshot(&browser, "dead-letters").await;

    // The filter form narrows them to one queue.
    browser
        .find(Locator::Id("queue"))
        .await
        .unwrap()
        .send_keys("mail")
        .await
        .unwrap();
    let heading = follow(&browser, Locator::Css("form.filters button")).await;
    assert_eq!(heading, "Dead letters");
    let source = browser.source().await.unwrap();
    assert!(source.contains("3 open letters match."), "{source}");
    assert!(!source.contains(&kept[0].to_string()));

    // Discarding the matching letters shows how many first; confirmed, it discards them.
    let heading = follow(
        &browser,
        Locator::Css("main form[action='/console/dead-letters/discard'] button"),
    )
    .await;
    assert_eq!(heading, "Discard letters");
    assert!(browser.source().await.unwrap().contains("3 letters"));
    screenshot(&browser, "bulk-confirm").await;
    let heading = follow(&browser, Locator::Css("button#confirm")).await;
    assert_eq!(heading, "Dead letters");
    let source = browser.source().await.unwrap();
    assert!(source.contains("Discarded 3 letters."), "{source}");
    assert!(source.contains("No open letter matches."));
    for id in &gone {
        assert!(!source.contains(&id.to_string()));
    }

    // A retained letter's job page replays it, once confirmed, into a new job.
    browser
        .goto(&format!("{}/console/dead-letters", console.base))
        .await
        .unwrap();
    let link = format!("a[href='/console/jobs/{}']", kept[0]);
    let heading = follow(&browser, Locator::Css(&link)).await;
    assert!(heading.starts_with("Job "), "{heading}");
    assert!(browser
        .source()
        .await
        .unwrap()
        .contains("Its payload is retained"));
    screenshot(&browser, "letter-job").await;
    let heading = follow(
        &browser,
        Locator::Css("main form[action$='/replay'] button"),
    )
    .await;
    assert_eq!(heading, "Replay letter");
    let heading = follow(&browser, Locator::Css("button#confirm")).await;
    assert!(heading.starts_with("Job "), "{heading}");
    let url = browser.current_url().await.unwrap();
    assert!(
        !url.path().ends_with(&kept[0].to_string()),
        "a new job: {url}"
    );
    assert!(browser.source().await.unwrap().contains("status-pending"));

    // A letter not retained is discarded from its job's page, once confirmed.
    let extra = by_hand(&client, "bob", 1, "misc", "handler_failed", false).await;
    browser
        .goto(&format!("{}/console/jobs/{}", console.base, extra[0]))
        .await
        .unwrap();
    let heading = follow(
        &browser,
        Locator::Css("main form[action$='/discard'] button"),
    )
    .await;
    assert_eq!(heading, "Discard letter");
    follow(&browser, Locator::Css("button#confirm")).await;
    browser
        .goto(&format!("{}/console/dead-letters", console.base))
        .await
        .unwrap();
    let source = browser.source().await.unwrap();
    assert!(!source.contains(&extra[0].to_string()), "{source}");
    assert!(source.contains("1 open letter matches."), "{source}");

    // The last one, retained, is replayed by the bulk replay, once confirmed.
    let heading = follow(
        &browser,
        Locator::Css("main form[action='/console/dead-letters/replay'] button"),
    )
    .await;
    assert_eq!(heading, "Replay letters");
    let heading = follow(&browser, Locator::Css("button#confirm")).await;
    assert_eq!(heading, "Dead letters");
    let source = browser.source().await.unwrap();
    assert!(source.contains("Replayed 1 letter."), "{source}");
    assert!(source.contains("No open letter matches."), "{source}");
    browser.close().await.unwrap();
}

#[test]
fn the_relative_time_reader_knows_the_consoles_forms() {
    for text in ["now", "in 2 min", "3 s ago", "1 d ago"] {
        assert!(is_relative(text), "{text}");
    }
    for text in [
        "",
        "in",
        "2 min",
        "3 weeks ago",
        "in x s",
        "2026-12-01T00:00:00Z",
    ] {
        assert!(!is_relative(text), "{text}");
    }
}
