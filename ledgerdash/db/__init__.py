"""The project's database backend (see :mod:`ledgerdash.db.postgresql`)."""
