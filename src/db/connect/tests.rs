//! Splitting a multi-host URL into one attempt per host, and the time-out's error.

use super::*;
use std::net::{IpAddr, Ipv4Addr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::config::{ChannelBinding, SslMode, SslNegotiation, TargetSessionAttrs};

#[test]
fn one_host_keeps_every_setting_of_a_single_host_url() {
    let mut pg = Config::new();
    pg.user("u")
        .password("p")
        .dbname("d")
        .options("-c x=1")
        .application_name("a")
        .host("h")
        .hostaddr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .port(7)
        .connect_timeout(Duration::from_secs(3))
        .tcp_user_timeout(Duration::from_secs(4))
        .keepalives(false)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(6))
        .keepalives_retries(8)
        .ssl_mode(SslMode::Require)
        .ssl_negotiation(SslNegotiation::Direct)
        .target_session_attrs(TargetSessionAttrs::ReadWrite)
        .channel_binding(ChannelBinding::Disable)
        .load_balance_hosts(LoadBalanceHosts::Random);
    assert!(one_host(&pg, 0) == pg);
    assert!(hosts(&pg) == vec![pg.clone()]);
    let mut socket = Config::new();
    socket.host_path("/run/postgresql");
    assert!(one_host(&socket, 0) == socket);
    let mut address = Config::new();
    address.hostaddr(IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert!(one_host(&address, 0) == address);
}

#[test]
fn a_multi_host_url_is_tried_host_by_host_with_each_hosts_port() {
    let pg: Config = "postgres://u@a:1,b:2/db?target_session_attrs=read-write"
        .parse()
        .unwrap();
    let each: Vec<_> = hosts(&pg)
        .iter()
        .map(|one| (one.get_hosts().to_vec(), one.get_ports().to_vec()))
        .collect();
    assert_eq!(
        each,
        [
            (vec![Host::Tcp("a".into())], vec![1]),
            (vec![Host::Tcp("b".into())], vec![2]),
        ]
    );
    assert!(hosts(&pg).iter().all(|one| one.get_target_session_attrs()
        == TargetSessionAttrs::ReadWrite
        && one.get_dbname() == Some("db")));
    let shared: Config = "host=a,b port=5 hostaddr=127.0.0.1,127.0.0.2 load_balance_hosts=random"
        .parse()
        .unwrap();
    let mut each: Vec<_> = hosts(&shared)
        .iter()
        .map(|one| (one.get_hostaddrs().to_vec(), one.get_ports().to_vec()))
        .collect();
    each.sort();
    assert_eq!(
        each,
        [
            (vec![IpAddr::from([127, 0, 0, 1])], vec![5]),
            (vec![IpAddr::from([127, 0, 0, 2])], vec![5]),
        ]
    );
}

#[test]
fn opening_a_session_may_take_one_connect_timeout_per_host() {
    let cfg = |url: &str| DatabaseConfig {
        connect_timeout: Duration::from_secs(2),
        ..DatabaseConfig::new(url)
    };
    assert_eq!(
        all_hosts_bound(&cfg("postgres://a,b,c/db")),
        Duration::from_secs(6)
    );
    assert_eq!(
        all_hosts_bound(&cfg("postgres://a/db")),
        Duration::from_secs(2)
    );
    assert_eq!(all_hosts_bound(&cfg("user=u")), Duration::from_secs(2));
    assert_eq!(
        all_hosts_bound(&cfg("postgres://a:x/db")),
        Duration::from_secs(2)
    );
}

#[tokio::test]
async fn an_attempt_out_of_time_fails_as_a_lost_connection_and_no_host_as_the_driver_says() {
    let e = timed_out().await;
    let io = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<io::Error>())
        .map(io::Error::kind);
    assert_eq!(io, Some(io::ErrorKind::TimedOut));
    assert!(crate::error::is_connection_loss(&e));
    let mut stream = TimedOut;
    assert!(stream.read(&mut [0; 1]).await.is_err());
    assert!(stream.flush().await.is_err());
    stream.shutdown().await.unwrap();
    let cfg = DatabaseConfig::new("user=nobody");
    let nowhere = Connector::for_role(&cfg, "test").unwrap();
    assert!(nowhere.connect().await.is_err());
}
