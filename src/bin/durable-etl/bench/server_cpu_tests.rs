//! The sampler's arithmetic and classification, over fake `/proc` readings.

use super::*;
use std::cell::Cell;

/// The bench database of the fake server.
const DB: &str = "durable_etl_bench_0badcafe";

/// A `/proc/<pid>/stat` line of `pid` named `comm`, child of `ppid`, started `start` ticks after
/// boot, with `utime` and `stime` ticks.
fn stat_line(pid: u32, comm: &str, ppid: u32, (utime, stime): (u64, u64), start: u64) -> String {
    format!(
        "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 120 0 0 0 {utime} {stime} 0 0 20 0 1 0 \
         {start} 221966336 4235 18446744073709551615 0 0 0 0 0 0 0 4096 17 0 0 0 0 0 0"
    )
}

/// A child's reading: `cpu` ticks, started at `start`.
fn child(pid: u32, start: u64, cpu: u64) -> (u32, Stat) {
    (
        pid,
        Stat {
            ppid: 1,
            start,
            cpu,
        },
    )
}

/// The titles of the fake server's processes, by pid.
fn title(pid: u32) -> Option<String> {
    Some(match pid {
        10 => "postgres: 15/main: checkpointer ".to_owned(),
        11 => "postgres: 15/main: walwriter ".to_owned(),
        12 => format!("postgres: 15/main: autovacuum worker {DB}"),
        20..=29 => format!("postgres: 15/main: postgres {DB} 127.0.0.1(4{pid}00) idle"),
        30..=39 => format!("postgres: 15/main: postgres {DB} [local] INSERT"),
        40 => "postgres: 15/main: postgres other_db 127.0.0.1(5000) idle".to_owned(),
        41 => {
            "postgres: 15/main: walsender postgres 127.0.0.1(5001) streaming 0/3000000".to_owned()
        }
        _ => return None,
    })
}

/// A window on [`DB`] beginning at tick 1,000, the bench's own sessions 28 and 29.
fn window() -> Window {
    Window::new(DB, [28, 29].into(), 1_000)
}

#[test]
fn stat_lines_give_the_parent_the_start_and_user_plus_system_ticks() {
    let line = stat_line(4321, "postgres", 2230, (150, 25), 98_765);
    assert_eq!(
        parse_stat(&line),
        Some(Stat {
            ppid: 2230,
            start: 98_765,
            cpu: 175
        })
    );
    // A command name with spaces and parentheses does not shift the fields.
    let odd = stat_line(7, "a ) b (c)", 1, (3, 4), 5);
    assert_eq!(
        parse_stat(&odd).map(|s| (s.ppid, s.cpu, s.start)),
        Some((1, 7, 5))
    );
    assert_eq!(parse_stat("4321 (postgres) S 2230"), None);
    assert_eq!(parse_stat(""), None);
}

#[test]
fn titles_tell_the_servers_own_processes_from_backends_and_walsenders() {
    let aux = |t: &str| parse_title(t) == Some(Title::Aux);
    assert!(aux("postgres: 15/main: checkpointer "));
    assert!(aux("postgres: background writer "));
    assert!(aux("postgres: 15/main: walwriter"));
    assert!(aux("postgres: 15/main: autovacuum launcher"));
    // An autovacuum worker names the database it vacuums, and is still the server's own.
    assert!(aux(&format!("postgres: 15/main: autovacuum worker {DB}")));
    assert!(aux("postgres: 15/main: logical replication launcher"));
    assert!(aux(
        "postgres: 15/main: bgworker: pg_wait_sampling collector"
    ));
    let backend = |t: &str| parse_title(t);
    let ours = Some(Title::Backend(DB.to_owned()));
    assert_eq!(backend(&title(20).unwrap_or_default()), ours);
    assert_eq!(backend(&title(30).unwrap_or_default()), ours);
    assert_eq!(
        backend(&format!(
            "postgres: postgres {DB} ::1(51000) idle in transaction"
        )),
        ours
    );
    assert_eq!(
        backend(&title(40).unwrap_or_default()),
        Some(Title::Backend("other_db".to_owned()))
    );
    assert_eq!(
        backend(&title(41).unwrap_or_default()),
        Some(Title::Walsender)
    );
    // A fresh fork still shows the postmaster's command line: not known yet.
    assert_eq!(
        parse_title("/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main"),
        None
    );
    assert_eq!(parse_title(""), None);
}

#[test]
fn a_process_present_at_the_start_counts_its_growth_and_one_born_in_the_window_all_of_its_cpu() {
    let mut w = window();
    let none = HashSet::new();
    // Replica backend 20 had used 500 ticks before the window; 21 is born in it.
    w.record(&[child(20, 900, 500)], &none, title);
    w.record(&[child(20, 900, 530), child(21, 1_100, 7)], &none, title);
    w.record(&[child(20, 900, 560), child(21, 1_100, 12)], &none, title);
    let split = w.split();
    assert_eq!(split.replicas, (60 + 12) as f64 / TICKS_PER_S);
    assert_eq!((split.producers, split.aux, split.other), (0.0, 0.0, 0.0));
}

#[test]
fn a_backend_that_exits_still_counts_up_to_its_last_sample_and_a_reused_pid_is_a_new_process() {
    let mut w = window();
    let none = HashSet::new();
    w.record(&[child(22, 900, 100)], &none, title);
    w.record(&[child(22, 900, 140)], &none, title);
    // 22 exited; a new backend got its pid.
    w.record(&[child(22, 1_500, 9)], &none, title);
    w.record(&[child(22, 1_500, 15)], &none, title);
    assert_eq!(w.split().replicas, (40 + 15) as f64 / TICKS_PER_S);
}

#[test]
fn a_process_missed_by_the_first_sample_but_older_than_the_window_counts_from_its_first_reading() {
    let mut w = window();
    let none = HashSet::new();
    w.record(&[], &none, title);
    w.record(&[child(23, 800, 1_000)], &none, title);
    w.record(&[child(23, 800, 1_020)], &none, title);
    assert_eq!(w.split().replicas, 20.0 / TICKS_PER_S);
}

#[test]
fn classes_split_replicas_producers_aux_and_other_and_leave_out_the_benchs_own_sessions() {
    let mut w = window();
    let producers: HashSet<u32> = [30, 31].into();
    let at = |cpu: u64| {
        [10, 11, 12, 20, 28, 29, 30, 31, 40, 41, 99]
            .map(|pid| child(pid, 900, cpu * u64::from(pid)))
    };
    w.record(&at(1), &producers, title);
    w.record(&at(2), &producers, title);
    let split = w.split();
    let s = |ticks: u32| f64::from(ticks) / TICKS_PER_S;
    assert_eq!(split.aux, s(10 + 11 + 12));
    assert_eq!(split.replicas, s(20));
    assert_eq!(split.producers, s(30 + 31));
    // Another database's backend, a walsender and a title never readable (99).
    assert_eq!(split.other, s(40 + 41 + 99));
}

#[test]
fn a_producer_is_known_by_its_session_even_if_its_title_came_first_and_titles_are_read_until_known()
{
    let mut w = window();
    let reads = Cell::new(0);
    let counted = |pid: u32| {
        reads.set(reads.get() + 1);
        // The fork's title is the postmaster's at the first read.
        (reads.get() > 1).then(|| title(pid)).flatten()
    };
    w.record(&[], &HashSet::new(), counted);
    w.record(&[child(32, 1_200, 4)], &HashSet::new(), counted);
    w.record(&[child(32, 1_200, 8)], &HashSet::new(), counted);
    w.record(&[child(32, 1_200, 10)], &[32].into(), counted);
    w.record(&[child(32, 1_200, 12)], &HashSet::new(), counted);
    assert_eq!(reads.get(), 2, "read until known, then never again");
    let split = w.split();
    assert_eq!((split.producers, split.replicas), (12.0 / TICKS_PER_S, 0.0));
}

#[test]
fn per_job_figures_count_replicas_producers_and_aux_and_only_report_other() {
    let split = Split {
        replicas: 0.03,
        producers: 0.02,
        aux: 0.01,
        other: 0.5,
    };
    let f = ServerCpu::per_job(split, 1_000);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(f.server_cpu_us_per_job, 60.0), "{f:?}");
    assert!(close(f.server_cpu_replicas_us_per_job, 30.0), "{f:?}");
    assert!(close(f.server_cpu_producers_us_per_job, 20.0), "{f:?}");
    assert!(close(f.server_cpu_aux_us_per_job, 10.0), "{f:?}");
    assert!(close(f.server_cpu_other_us_per_job, 500.0), "{f:?}");
    let none = ServerCpu::per_job(split, 0);
    assert_eq!(none.server_cpu_us_per_job, 0.0);
    assert_eq!(none.server_cpu_other_us_per_job, 0.0);
    assert!(f
        .to_text()
        .starts_with("server CPU per job   60.0 us (replicas 30.0"));
}
