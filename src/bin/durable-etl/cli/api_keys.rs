//! `durable-etl api-keys`: create an owner's API key (shown once) or revoke one, in one cell, or,
//! with `--directory` and no `--cell`, in the cell the directory places the owner in, the key
//! recorded in the directory so a routed API (`serve --directory`) finds its cell.

use super::{open_admin, ApiKeysCommand, CreateKeyArgs};
use durable_etl::config::DatabaseConfig;
use durable_etl::db;
use durable_etl::digest::Secret;
use durable_etl::directory::{self, KeyRef};
use durable_etl::error::Error;
use durable_etl::service::api_keys::{self, CreatedKey, Role};
use tokio_postgres::GenericClient;

/// Runs `command` on the cell `client` is a session of.
///
/// # Errors
/// [`Error::NoLiveKey`] when revoking a key that is not live; database errors.
pub(crate) async fn run(client: &impl GenericClient, command: ApiKeysCommand) -> Result<(), Error> {
    match command {
        ApiKeysCommand::Create(args) => {
            let (secret, role) = key_of(&args)?;
            let created = api_keys::create_as(client, &secret, &args.whose.owner, role).await?;
            shown(&created, None);
            Ok(())
        }
        ApiKeysCommand::Revoke(args) => revoke(client, args.id).await,
    }
}

/// Runs `command` routed by the directory `db_config` names: a key is created in its owner's
/// cell (placing the owner first if it has none) and recorded in the directory before it is
/// stored in the cell, so every key a cell holds routes there; a key is revoked in the cell the
/// directory routes it to (and in the next one, if its owner moved meanwhile).
///
/// # Errors
/// [`Error::NoLiveKey`] when the directory records no such key, or it is not live;
/// [`Error::OwnerMoved`] while the owner is moving (nothing shown, nothing revoked: run it
/// again once the move is over); as [`directory::place`], and start-up and database errors.
pub(crate) async fn run_routed(
    db_config: &DatabaseConfig,
    start_up: &db::StartUp,
    command: ApiKeysCommand,
) -> Result<(), Error> {
    let dir = start_up.run(|| db::connect(db_config, "admin")).await?;
    match command {
        ApiKeysCommand::Create(args) => {
            let (secret, role) = key_of(&args)?;
            let owner_key = args.whose.jobs()?.owner_key();
            let cell = directory::place(&dir, &owner_key).await?;
            directory::settled(&dir, &owner_key).await?;
            let pool = open_admin(&in_cell(&dir, &cell, db_config).await?, start_up).await?;
            let created = CreatedKey::generate();
            let digest = api_keys::key_digest(&secret, &created.key);
            directory::add_key(&dir, created.id, &digest, &owner_key).await?;
            let conn = db::checkout(&pool).await?;
            api_keys::store(&*conn, &secret, &owner_key, role, &created).await?;
            // A move that began meanwhile may have copied the cell before the key: then the key
            // is never shown, so nobody holds it wherever it ended up.
            directory::settled(&dir, &owner_key).await?;
            shown(&created, Some(&cell));
            Ok(())
        }
        ApiKeysCommand::Revoke(args) => {
            let mut cell = directory::key_cell(&dir, KeyRef::Id(args.id)).await?;
            let mut revoked_in = None;
            // Revoked in the key's cell, and again in the owner's new cell if a move carried
            // the key there, live, meanwhile.
            while let Some(name) = cell.filter(|name| revoked_in.as_ref() != Some(name)) {
                let pool = open_admin(&in_cell(&dir, &name, db_config).await?, start_up).await?;
                let conn = db::checkout(&pool).await?;
                let live = api_keys::revoke(&*conn, args.id).await?;
                if !live && revoked_in.is_none() {
                    return Err(Error::NoLiveKey(args.id));
                }
                revoked_in = Some(name);
                cell = directory::key_cell(&dir, KeyRef::Id(args.id)).await?;
            }
            if revoked_in.is_none() {
                return Err(Error::NoLiveKey(args.id));
            }
            println!("revoked {}", args.id);
            Ok(())
        }
    }
}

/// `db_config` (the directory's) pointed at cell `name`'s server, as the directory lists it.
async fn in_cell(
    dir: &impl GenericClient,
    name: &str,
    db_config: &DatabaseConfig,
) -> Result<DatabaseConfig, Error> {
    directory::cell(dir, name).await?.config(db_config)
}

/// The secret and role `args` ask for.
fn key_of(args: &CreateKeyArgs) -> Result<(Secret, Role), Error> {
    let secret = args.whose.secret()?;
    let role = if args.operator {
        Role::Operator
    } else {
        Role::Owner
    };
    Ok((secret, role))
}

/// Prints a created key, once, and the cell it was stored in if routed.
fn shown(created: &CreatedKey, cell: Option<&str>) {
    println!("id:  {}\nkey: {}", created.id, created.key);
    if let Some(cell) = cell {
        println!("cell: {cell}");
    }
    println!("The key is shown once; only its digest is stored.");
}

/// Revokes key `id` on `client`'s cell.
async fn revoke(client: &impl GenericClient, id: uuid::Uuid) -> Result<(), Error> {
    if !api_keys::revoke(client, id).await? {
        return Err(Error::NoLiveKey(id));
    }
    println!("revoked {id}");
    Ok(())
}
