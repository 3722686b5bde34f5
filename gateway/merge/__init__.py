"""The reconciler's parts: its vocabulary and the small machines `gateway.reconcile` composes.

`vocabulary` (states, events, actions), `stats` (counters), `held` (batches waiting for N), `requests`
(gaps and the replay requests that fill them: retries, backoff, progress deadlines) and `position` (N, the
head, the live edge, the lag). None of them changes the reconciler's state: every transition is in
`gateway.reconcile.TRANSITIONS`. Like the reconciler, they are sans-IO: time comes in as ``now``.
"""
