"""SQLite persistence through SQLAlchemy 2.0: engine, models, the Store adapter, migrations."""
