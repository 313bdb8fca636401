"""The annotators' busiest request (submit-and-next: store a comparison, lease the next pair, render it), in SQL
written once, and the only place where raw SQL of the annotation path lives.

Why: on that request the ORM spent more CPU building its statements than the database spent running them, and the
request has to sustain some 200 labels a second on two cores. So its few statements are text built once per process,
with column lists taken from the models and values converted exactly as the ORM converts them (`rows.Rows`), and on
PostgreSQL each is prepared once per connection (`rows.sql_cursor`; DATABASE_PREPARED_STATEMENTS=false turns that
off for a connection pooler that cannot keep prepared statements). Other requests share only the reads that every
request or every page of a project makes (the session, the user, the membership); everything else uses the ORM.

What it holds, one module per concern, each above `rows`:
- `rows`: model instances from raw rows, inserts, `fetch_one`/`fetch_all` and the preparing cursor;
- `sessions`: the session and the logged-in user, read before every view (for `feedback_app.sessions`);
- `labels`: inserting new labels, and the annotator's current comparison of a pair with its row locked;
- `queue_sql`: the user's current lease, leasing an item (one statement on PostgreSQL, a transaction on SQLite),
  and counting a label towards its item (with the insert, in one statement, on PostgreSQL);
- `reads`: the membership (with its project and environment), the membership with an assignment, the pair of
  trajectories on the compare page and their steps, with the per-process cache of rendered steps.

Callers call the named functions; they never hold SQL. The tests of these statements (tests/feedback_app:
test_queue, test_labelling, views/test_compare, views/test_compare_submit, test_sessions, api/test_queue_api) run on
PostgreSQL and on SQLite in CI (.ci/run); several are PostgreSQL's only (the one-statement lease, its plan,
prepared statements).
"""
