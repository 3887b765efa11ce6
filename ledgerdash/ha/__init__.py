"""PostgreSQL that fails over: a primary and a synchronous standby managed by
Patroni with etcd (:mod:`.cluster`), and the failover drill that proves the
ledger loses, repeats and strands nothing when the primary dies or freezes
(:mod:`.drill`, ``manage.py ha_drill``, ``make ha-drill``)."""
