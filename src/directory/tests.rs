//! The directory against PostgreSQL: cells listed and opened, owners placed once and kept.

use super::*;
use crate::test_db::TestDb;

/// An owner key whose first four bytes (what placement spreads by) are `lead`.
fn key(lead: u32, rest: u8) -> [u8; 32] {
    let mut key = [rest; 32];
    key[..4].copy_from_slice(&lead.to_be_bytes());
    key
}

#[tokio::test]
async fn cells_are_listed_once_by_a_valid_name_and_a_whole_server() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // Before the directory is built, every call says so.
    assert!(matches!(
        cells(&client).await,
        Err(Error::Config(ConfigError::NoDirectory))
    ));
    init(&client).await.unwrap();
    init(&client).await.unwrap();
    add(&client, "cell_b", Some(("db-b.internal", 5433)))
        .await
        .unwrap();
    add(&client, "cell_a", None).await.unwrap();
    let refused = [
        (add(&client, "cell_a", None).await, ConfigError::CellListed),
        (add(&client, "Cell", None).await, ConfigError::CellName),
        (add(&client, "pg_cell", None).await, ConfigError::CellName),
        (
            add(&client, "cell_c", Some(("", 5432))).await,
            ConfigError::CellServer,
        ),
        (
            set_open(&client, "cell_z", false).await,
            ConfigError::UnknownCell,
        ),
    ];
    for (outcome, wanted) in refused {
        match outcome {
            Err(Error::Config(e)) => assert_eq!(e.to_string(), wanted.to_string()),
            other => panic!("{other:?}"),
        }
    }
    let listed = cells(&client).await.unwrap();
    let names: Vec<_> = listed.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["cell_a", "cell_b"]);
    assert_eq!(listed[0].server, None);
    assert_eq!(listed[1].server, Some(("db-b.internal".to_owned(), 5433)));
    assert!(listed.iter().all(|c| c.open && c.owners == 0));
    assert!(matches!(
        cell(&client, "cell_z").await,
        Err(Error::Config(ConfigError::UnknownCell))
    ));
}

#[tokio::test]
async fn an_owner_is_placed_by_its_key_among_the_open_cells_and_stays_there() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    init(&client).await.unwrap();
    // No open cell: an owner without one cannot be placed.
    assert!(matches!(
        place(&client, &key(0, 1)).await,
        Err(Error::Config(ConfigError::NoOpenCell))
    ));
    add(&client, "cell_a", None).await.unwrap();
    add(&client, "cell_b", None).await.unwrap();
    // Spread by the key's first four bytes over the open cells by name.
    assert_eq!(place(&client, &key(4, 1)).await.unwrap(), "cell_a");
    assert_eq!(place(&client, &key(5, 1)).await.unwrap(), "cell_b");
    assert_eq!(place(&client, &key(u32::MAX, 1)).await.unwrap(), "cell_b");
    // Closing a cell and adding one places new owners among the open ones only, and moves
    // nobody: each placed owner stays where its jobs are.
    set_open(&client, "cell_a", false).await.unwrap();
    add(&client, "cell_c", None).await.unwrap();
    assert_eq!(place(&client, &key(4, 2)).await.unwrap(), "cell_b");
    assert_eq!(place(&client, &key(5, 2)).await.unwrap(), "cell_c");
    assert_eq!(place(&client, &key(4, 1)).await.unwrap(), "cell_a");
    assert_eq!(place(&client, &key(5, 1)).await.unwrap(), "cell_b");
    assert_eq!(
        find(&client, &key(4, 2)).await.unwrap().as_deref(),
        Some("cell_b")
    );
    assert_eq!(find(&client, &key(6, 9)).await.unwrap(), None);
    let owners: Vec<_> = cells(&client)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.open, c.owners))
        .collect();
    assert_eq!(
        owners,
        [
            ("cell_a".to_owned(), false, 1),
            ("cell_b".to_owned(), true, 3),
            ("cell_c".to_owned(), true, 1)
        ]
    );
}

/// A first ask that meets another's placement of the same owner, still in flight, waits for it
/// and answers the cell that one wrote, not the one its own spread picks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_ask_racing_another_answers_the_cell_the_other_wrote() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    init(&client).await.unwrap();
    add(&client, "cell_a", None).await.unwrap();
    add(&client, "cell_b", None).await.unwrap();
    // Its own spread picks cell_a (4 modulo 2 open cells).
    let owner = key(4, 7);
    let mut holder = db.client().await;
    let placing = holder.transaction().await.unwrap();
    placing
        .execute(
            "INSERT INTO durable_etl_directory.owners (owner_key, cell) VALUES ($1, 'cell_b')",
            &[&&owner[..]],
        )
        .await
        .unwrap();
    let asker = db.client().await;
    let ask = tokio::spawn(async move { place(&asker, &owner).await.unwrap() });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !ask.is_finished(),
        "the ask waits for the placement in flight"
    );
    placing.commit().await.unwrap();
    assert_eq!(ask.await.unwrap(), "cell_b");
    assert_eq!(
        find(&client, &owner).await.unwrap().as_deref(),
        Some("cell_b")
    );
}

#[tokio::test]
async fn a_cell_config_points_the_directorys_settings_at_the_cells_server() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    init(&client).await.unwrap();
    add(&client, "cell_here", None).await.unwrap();
    add(&client, "cell_there", Some(("10.0.0.7", 6432)))
        .await
        .unwrap();
    let base = DatabaseConfig {
        cell: Some("cell_there".to_owned()),
        ..db.config.clone()
    };
    let there = cell_config(&base).await.unwrap();
    assert_eq!(there.cell.as_deref(), Some("cell_there"));
    let pg: tokio_postgres::Config = there.url.parse().unwrap();
    assert_eq!(
        pg.get_hosts(),
        [tokio_postgres::config::Host::Tcp("10.0.0.7".to_owned())]
    );
    assert_eq!(pg.get_ports(), [6432]);
    let own: tokio_postgres::Config = db.config.url.parse().unwrap();
    assert_eq!(pg.get_dbname(), own.get_dbname());
    assert_eq!(pg.get_user(), own.get_user());
    let here = DatabaseConfig {
        cell: Some("cell_here".to_owned()),
        ..db.config.clone()
    };
    assert_eq!(cell_config(&here).await.unwrap().url, db.config.url);
    let unnamed = cell_config(&db.config).await.unwrap_err();
    assert!(matches!(unnamed, Error::Config(ConfigError::DirectoryCell)));
    let unknown = DatabaseConfig {
        cell: Some("cell_gone".to_owned()),
        ..db.config.clone()
    };
    assert!(matches!(
        cell_config(&unknown).await,
        Err(Error::Config(ConfigError::UnknownCell))
    ));
}

#[tokio::test]
async fn an_api_key_routes_to_its_owners_cell_by_digest_and_by_id() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, digest, owner) = (uuid::Uuid::now_v7(), [7; 32], key(1, 3));
    // Before the directory is built, every call says so.
    for outcome in [
        key_cell(&client, KeyRef::Id(id)).await.map(drop),
        add_key(&client, id, &digest, &owner).await,
        check(&client).await,
    ] {
        assert!(matches!(
            outcome,
            Err(Error::Config(ConfigError::NoDirectory))
        ));
    }
    init(&client).await.unwrap();
    add(&client, "cell_a", None).await.unwrap();
    add(&client, "cell_b", None).await.unwrap();
    // A key of an owner the directory has not placed is refused, and nothing is recorded.
    assert!(add_key(&client, id, &digest, &owner).await.is_err());
    assert_eq!(key_cell(&client, KeyRef::Id(id)).await.unwrap(), None);
    let cell = place(&client, &owner).await.unwrap();
    add_key(&client, id, &digest, &owner).await.unwrap();
    let by_digest = key_cell(&client, KeyRef::Digest(&digest)).await.unwrap();
    assert_eq!(by_digest.as_deref(), Some(cell.as_str()));
    let by_id = key_cell(&client, KeyRef::Id(id)).await.unwrap();
    assert_eq!(by_id.as_deref(), Some(cell.as_str()));
    // Unknown keys route nowhere; a digest is recorded once.
    let other = uuid::Uuid::now_v7();
    assert_eq!(
        key_cell(&client, KeyRef::Digest(&[8; 32])).await.unwrap(),
        None
    );
    assert_eq!(key_cell(&client, KeyRef::Id(other)).await.unwrap(), None);
    assert!(add_key(&client, other, &digest, &owner).await.is_err());
    assert_eq!(count_keys(&client).await, 1);
    check(&client).await.unwrap();
    // A directory an older release built, without the keys' table, is not ready for a routed
    // API until `cells init` runs again; the keys' table is then added, the cells kept.
    let old = TestDb::migrated().await;
    let old_client = old.client().await;
    init(&old_client).await.unwrap();
    add(&old_client, "cell_a", None).await.unwrap();
    old_client
        .batch_execute("DROP TABLE durable_etl_directory.api_keys")
        .await
        .unwrap();
    assert!(matches!(
        check(&old_client).await,
        Err(Error::Config(ConfigError::NoDirectory))
    ));
    init(&old_client).await.unwrap();
    check(&old_client).await.unwrap();
    assert_eq!(cells(&old_client).await.unwrap().len(), 1);
}

/// How many keys the directory records.
async fn count_keys(client: &tokio_postgres::Client) -> i64 {
    let sql = "SELECT count(*) FROM durable_etl_directory.api_keys";
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_moving_owner_routes_nowhere_until_its_move_switches_it() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    init(&client).await.unwrap();
    add(&client, "cell_a", None).await.unwrap();
    add(&client, "cell_b", None).await.unwrap();
    let (id, digest, owner) = (uuid::Uuid::now_v7(), [9; 32], key(2, 5));
    let cell = place(&client, &owner).await.unwrap();
    add_key(&client, id, &digest, &owner).await.unwrap();
    settled(&client, &owner).await.unwrap();
    let other = if cell == "cell_a" { "cell_b" } else { "cell_a" };
    client
        .execute(
            "INSERT INTO durable_etl_directory.moves (owner_key, id, from_cell, to_cell, step)
             VALUES ($1, $2, $3, $4, 'fence')",
            &[&&owner[..], &uuid::Uuid::now_v7(), &cell, &other],
        )
        .await
        .unwrap();
    for step in ["fence", "drain", "copy", "switch"] {
        client
            .execute("UPDATE durable_etl_directory.moves SET step = $1", &[&step])
            .await
            .unwrap();
        for outcome in [
            key_cell(&client, KeyRef::Digest(&digest)).await.map(drop),
            key_cell(&client, KeyRef::Id(id)).await.map(drop),
            settled(&client, &owner).await,
        ] {
            assert!(
                matches!(outcome, Err(Error::OwnerMoved)),
                "{step}: {outcome:?}"
            );
        }
    }
    // Switched (the clean step): the owner's keys route to its cell again.
    client
        .execute("UPDATE durable_etl_directory.moves SET step = 'clean'", &[])
        .await
        .unwrap();
    settled(&client, &owner).await.unwrap();
    let routed = key_cell(&client, KeyRef::Id(id)).await.unwrap();
    assert_eq!(routed.as_deref(), Some(cell.as_str()));
    // A directory an older release built, without the moves' table, is not ready for a routed
    // API until `cells init` runs again.
    client
        .batch_execute("DROP TABLE durable_etl_directory.moves")
        .await
        .unwrap();
    assert!(matches!(
        check(&client).await,
        Err(Error::Config(ConfigError::NoDirectory))
    ));
    init(&client).await.unwrap();
    check(&client).await.unwrap();
}
