"""What every training backend is: one rank's model (``engine.py``) with its parts joined,
each in its own module by role:

* ``scoring.py``   the frozen scorer: forward-only passes (a reference, a reward model
                   scoring, the policy's log-probabilities, the critic's values);
* ``training.py``  the trainable part: optimizer steps under an objective, the schedule;
* ``weights.py``   full weights: buckets for a weight sync, a Hugging Face directory;
* ``resume.py``    the backend checkpoint, written and read back exactly;
* ``roles.py``     what the model is: the policy, the critic or a reward model.

A backend (FSDP2, DeepSpeed) subclasses ``TrainingBackend`` and supplies only how the model
is wrapped, backward, the clipped optimizer step, full-weight gathering and its sharded model
+ optimizer checkpoint (``BackendEngine``'s abstract methods). It runs inside one learner
rank after ``torch.distributed`` is initialised (gloo on CPU, NCCL on GPU). Every public
method is collective: all ranks call it with the same batch.
"""

from __future__ import annotations

from rlsys.backends.resume import Resumable
from rlsys.backends.scoring import FrozenScorer
from rlsys.backends.training import TrainSteps
from rlsys.backends.weights import FullWeights


class TrainingBackend(TrainSteps, FrozenScorer, FullWeights, Resumable):
    """One rank of a data-parallel model and its optimizer: the policy (``role="policy"``,
    log-probabilities), a critic (``role="value"``, a value head on the same decoder) or a
    reward model being trained (``role="reward"``, a sequence-classification model: one
    score per sequence).

    With ``trainable=False`` it is inference-only (the frozen reference policy): sharded
    like a learner, but with no gradients and no optimizer state; forward passes only.

    A subclass's constructor sets ``model`` and ``module``; it implements the abstract
    methods of ``BackendEngine``."""
