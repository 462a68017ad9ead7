from tests.dagster.conftest import tpcb, PGBENCH
import dagster as dg

def show(r):
    for e in r.get_asset_materialization_events():
        print(e.asset_key, {k: v.value for k, v in e.materialization.metadata.items() if k not in ("dagster/column_schema","data_files_table")})

def test_smoke(mc):
    r = mc.materialize("mirror/pgbench_accounts")
    for i in range(4):
        tpcb(mc.dsn, 30, seed=i)
        show(mc.materialize("flush/pgbench_accounts", "deletion_vectors/pgbench_accounts"))
    print(mc.replication.table_status("pgbench_accounts"))
    show(mc.materialize("index_merge/pgbench_accounts", run_config={"ops": {"index_merge__pgbench_accounts": {"config": {"full": True}}}}))
    print(mc.replication.compact("pgbench_accounts", dry_run=True))
    show(mc.materialize("compaction/pgbench_accounts"))
    print(mc.replication.table_status("pgbench_accounts"))
