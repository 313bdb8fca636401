"""Simulated annotators: B-Pref's scripted teacher, labelling through the REST API and the same queue as people.

A simulated annotator is an API client like any other. It leases the next item with
``POST /api/projects/<id>/assignments/next/``, reads the trajectories and their task over the API, asks the
environment's hidden oracle what is true, and answers the way a teacher with the B-Pref parameters would (Lee et
al. 2021, "B-Pref: benchmarking preference-based reinforcement learning"):

- per-step reward r_t: the oracle's graded return after step t minus before it (``progress_return`` where the oracle
  has one, so two failures are ordered by how close they got; else ``true_return``);
- myopic return R = sum_t gamma^(T-1-t) r_t (gamma < 1 weighs the last steps most);
- skip when max(R_A, R_B) < skip_threshold; tie when |R_A - R_B| <= equal_threshold;
- else P(A > B) = sigmoid(beta * (R_A - R_B)) (beta = inf: always the better one), then a mistake flips the choice
  with probability epsilon.

Step labels are +1 where the oracle calls a step correct and -1 elsewhere (flipped with probability epsilon), or, with
``first_error_marks``, PRM800K's shortcut: the first step the teacher calls wrong is -1, the steps before it +1;
critiques name the first wrong step and the better action in the words of the simulated training data
(``simulation.episodes``); an intervention puts the oracle's best action at the first wrong step. With the mistake
rate, a critique or an intervention misplaces the error: it lands on another step, or on none. Where the environment's
actions are assistant messages (the tool shop), each step's action is read from its message as the agent wrote it, a
critique writes calls as ``name(arguments)``, and the correction is the oracle's message. The labels go through the
API's own endpoints with the assignment, so they carry the item's query strategy and count towards the queue exactly as
a person's, and each records as its ``seconds_spent`` what the annotator-time model (`feedback_app.annotator_time`)
says a person would have taken over it.

No Django here: the loop benchmark runs crowds from a plain process against a real server.

The modules: `teacher` (the B-Pref teacher's judgements from the oracle), `api_client` (HTTP to Tandem's API) and
`annotator` (one simulated annotator working the queue, and `run_crowd` for many at once).
"""
