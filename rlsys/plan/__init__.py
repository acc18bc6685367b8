"""``rlsys plan``: predict a run's throughput before paying for it.

* ``costs``      per-stage cost model (generation, learner passes, weight sync, scoring)
* ``workload``   what a run does (batch, samples, lengths) and where (pools, staleness)
* ``simulator``  a discrete-event simulation of the pipeline, driving the real buffer
* ``cores``      processor sharing of a machine's cores among the simulated stages
* ``calibrate``  the cost model's constants fitted from run directories' metrics
* ``hardware``   published GPU and model figures (never measured here) and clusters of them
* ``layout``     one candidate of the search, described once: what is priced and printed
* ``memory``     what a candidate's learner ranks and engines hold on a GPU
* ``pricing``    a candidate's stage costs from the published figures
* ``search``     placements for a cluster, ranked by predicted samples/s
* ``command``    the ``rlsys plan`` command

docs/planning.md has the model, its assumptions and its validation.
"""
