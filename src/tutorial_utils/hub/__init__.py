"""The Hub stage: the official chain's downloads (checkpoint, gated Cosmos backbone, IPEC LIBERO
datasets) with real ``huggingface_hub``, as a plan, a download and a verification.

- :mod:`.assets`: the asset table (``checkpoint``, ``cosmos``, ``dataset:<suite>``);
- :mod:`.download`: ``plan`` (files and bytes from the repo tree), ``download``
  (``snapshot_download`` in a child process, token only through the environment), ``verify``
  (sizes, sha256, key files, stale ``.incomplete`` files, then ``manifest.json`` as the success
  sign) and the teaching errors for 401, 403 gated, not found and timeouts;
- :mod:`.local_server`: a local stand-in for the Hub (the book and the tests cannot reach
  huggingface.co): folders served as model / dataset repos, gating, tokens, injected faults;
- :mod:`.archive`: a dataset archive (``.tar``/``.zip``) from a URL, checked and safely extracted;
- :mod:`.job`: the download job (``notebooks/jobs/download.md``, ``DownloadConfig``);
- :mod:`.cli`: ``python -m tutorial_utils hub {plan,download,verify,serve,list} ASSET --dest DIR``.

``huggingface_hub`` is imported only inside the functions that need it.
"""
