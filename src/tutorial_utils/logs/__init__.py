"""Run logs: the log-line contract and its parsers, and the diagnosis of a failed run.

- :mod:`tutorial_utils.logs.lines`: the format constants the writers (``train``, ``evaluate``,
  ``serve``) log with (``TRAIN_STEP_LOSS``, ``SERVER_RUNNING``, ``EVAL_SUCCESS``...) and the parsers
  that read them back (``parse_train_log``, ``parse_server_log``, ``parse_eval_log``), upstream's
  Rich-formatted logs included (``normalise``);
- :mod:`tutorial_utils.logs.diagnosis`: the detectors of upstream's real error strings
  (``DETECTORS``), the success signs and ``diagnose``, which names the stage that failed and its
  likely causes; ``python -m tutorial_utils logs`` is its ``main``.

Both are re-exported here (``from tutorial_utils import logs as L; L.TRAIN_STEP_LOSS; L.diagnose``).
Standard library only: importing this package stays instant.
"""

from tutorial_utils.logs.diagnosis import *  # noqa: F403
from tutorial_utils.logs.lines import *  # noqa: F403
