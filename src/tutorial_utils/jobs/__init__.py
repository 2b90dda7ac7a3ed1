"""Job notebooks run by papermill, and the runs they leave.

A job is a MyST notebook under ``notebooks/jobs/``; running it gives the run an id and a
self-describing directory under ``runs/``. Each concern is its own module:

- :mod:`tutorial_utils.jobs.records`: run ids, run directories, ``status.json`` (read, merged
  under a lock), the heartbeat and a run's state (``stale`` when its runner is gone), finding runs;
- :mod:`tutorial_utils.jobs.process`: a free port, stopping a child process, whether a pid lives;
- :mod:`tutorial_utils.jobs.parameters`: a job notebook's ``parameters`` cell (read, evaluated
  under a profile, generated from its config classes) and the types of the values a run passes;
- :mod:`tutorial_utils.jobs.registry`: each job's config classes and extra parameters (``JOBS``,
  ``"module:attribute"`` strings), the entry a job notebook's front matter names
  (``tutorial_job: train``);
- :mod:`tutorial_utils.jobs.runner`: ``run_notebook`` (papermill, every file redacted as it is
  written) and ``python -m tutorial_utils job`` (its ``main``).

The public names of all but the registry are re-exported here (``from tutorial_utils import jobs;
jobs.run_notebook``).
Importing this package stays instant: papermill, jupytext and yaml are imported when used.
"""

from tutorial_utils.jobs.parameters import *  # noqa: F403
from tutorial_utils.jobs.process import *  # noqa: F403
from tutorial_utils.jobs.records import *  # noqa: F403
from tutorial_utils.jobs.runner import *  # noqa: F403
