"""Human feedback: a labelling web app on a SQL database (SQLite or PostgreSQL).

A leaf package: core `feedbackrl` never imports it, and it needs the `feedback` extra
(`pip install -e '.[feedback]'`). Layout:

- `store.py`    SQLAlchemy models, tokens, opening a database (runs the Alembic migrations)
- `labels.py`   the queue and the label rules: next item, submit (idempotent), undo, progress, agreement
- `items.py`    items from JSONL rows or sampled from a policy checkpoint
- `export.py`   labels -> the preference dataset format of `feedbackrl.data.preferences`
- `app.py`      the FastAPI app and its JSON API (bearer tokens); `pages.py` the server-rendered pages
                (templates/); `auth.py` who is asking, one transaction per request
- `migrations/` the Alembic schema history (`store.open_db` upgrades to head)

See docs/human_feedback.md for the user guide.
"""
