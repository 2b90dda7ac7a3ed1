"""Every job's ``parameters`` cell is generated from its config classes (``python -m tutorial_utils
job params --write``), and drift either way fails here: a config field missing from the cell, a
cell parameter no config declares, or a default that differs in any profile."""

import dataclasses
import re
import subprocess
import sys

import pytest

from conftest import REPO
from tutorial_utils import jobs, params, paths
from tutorial_utils.jobs import registry

JOBS = sorted(paths.JOBS.glob("*.md"))


def test_every_job_notebook_names_its_registry_entry():
    """A job notebook's front matter names its job only (``tutorial_job: <its file's name>``), the
    registry (``jobs/registry.py``) has exactly the notebooks' jobs, and each entry's config
    classes and extra parameters resolve: any disagreement fails here."""
    named = {p.stem: jobs.read_notebook(p).metadata.get(jobs.JOB_METADATA) for p in JOBS}
    assert named == {job: job for job in named}, "each job notebook's front matter must be `tutorial_job: <job>`"
    assert set(named) == set(registry.JOBS), "notebooks/jobs/ and jobs/registry.py's JOBS name different jobs"
    for job, entry in registry.JOBS.items():
        assert set(entry) <= {"configs", "extra_parameters"} and entry["configs"], job
        for ref in (*entry["configs"], *filter(None, [entry.get("extra_parameters")])):
            assert registry.resolve(ref).__module__ == ref.partition(":")[0], f"{job}: {ref} is not defined there"


def test_a_front_matter_that_names_no_job_entry_is_refused():
    nb = jobs.read_notebook(paths.JOBS / "train.md")
    assert [c.__name__ for c in jobs.config_classes(nb)] == ["TrainConfig", "BackendParams"]
    for stale in ({"configs": ["tutorial_utils.train.config:TrainConfig"]}, "nosuch"):
        nb.metadata[jobs.JOB_METADATA] = stale
        with pytest.raises(jobs.JobError, match=r"names no job of tutorial_utils\.jobs\.registry\.JOBS.*train"):
            jobs.config_classes(nb)
    del nb.metadata[jobs.JOB_METADATA]
    assert jobs.config_classes(nb) == [] and jobs.extra_parameters(nb, {}, {}) == ({}, None)


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_the_parameters_cell_is_generated_from_the_config(path):
    nb = jobs.read_notebook(path)
    _, have = jobs.parameters_cell(nb)
    assert have.strip() == jobs.generated_parameters(nb).strip(), (
        f"{path.name}: its parameters cell is out of date; run `python -m tutorial_utils job params --write`"
    )
    # both ways, by name and by each profile's value
    classes = jobs.config_classes(nb)
    fields = {
        f.name: f
        for c in classes
        for f in dataclasses.fields(c)
        if f.metadata.get("help") and f.metadata.get("job", True)
    }
    for profile in ("ci", "cpu", "gpu"):
        cell = jobs.default_parameters(nb, profile=profile)
        assert set(cell) - {jobs.RUN_DIR_PARAM} == set(fields), path.name
        for name, f in fields.items():
            assert cell[name] == params.profile_values(f)[profile], (path.name, profile, name)


def test_drift_is_found_both_ways_and_write_fixes_it(tmp_path, monkeypatch):
    src = (paths.JOBS / "record_demos.md").read_text(encoding="utf-8")
    nb_path = tmp_path / "record_demos.md"
    # a parameter the config does not declare, and a config field the cell lacks
    nb_path.write_text(src.replace("seed = 7", "seed_typo = 7"), encoding="utf-8")
    assert jobs.write_parameters([nb_path], write=False) == [nb_path]
    # a default that differs in one profile only
    line = next(x for x in src.splitlines() if x.startswith("episodes_per_task = pick("))
    cpu = int(re.search(r"cpu=(\d+)", line).group(1))
    nb_path.write_text(src.replace(line, line.replace(f"cpu={cpu},", f"cpu={cpu + 1},")), encoding="utf-8")
    assert jobs.write_parameters([nb_path], write=False) == [nb_path]
    assert jobs.write_parameters([nb_path], write=True) == [nb_path]
    assert nb_path.read_text(encoding="utf-8") == src  # the rest of the file kept byte for byte
    assert jobs.write_parameters([nb_path], write=False) == []


def test_a_new_config_field_reaches_the_cell(monkeypatch):
    """Adding a field to a config and rerunning the command is all it takes."""
    from tutorial_utils.sim.record import RecordConfig

    @dataclasses.dataclass(frozen=True)
    class Grown(RecordConfig):
        camera_fps: int = params.param(20, "a new parameter", cpu=10)

    cell = params.parameters_cell(Grown, extra=['run_dir = ""'])
    assert "camera_fps = pick(ci=20, cpu=10, gpu=10)  # a new parameter" in cell.splitlines()
    with pytest.raises(Exception, match="declared by both"):
        params.parameters_cell(RecordConfig, RecordConfig)


@pytest.mark.slow
def test_the_documented_command_checks_the_notebooks():
    """The command CONTRIBUTING.md gives, as a contributor runs it."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "python -m tutorial_utils job params --write" in text
    r = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "job", "params", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_profile_values_keep_none_as_a_value():
    @dataclasses.dataclass
    class C:
        limit: int | None = params.param(20, "h", cpu=None)

    (f,) = dataclasses.fields(C)
    assert params.profile_values(f) == {"ci": 20, "cpu": None, "gpu": None}
    assert "ci `20`, cpu `None`, gpu `None`" in params.markdown_table(C)


def test_parameter_tables_show_the_aliases_column_only_when_it_has_content():
    from tutorial_utils.train.config import parameters_table

    @dataclasses.dataclass
    class C:
        lr: float = params.param(1e-4, "peak learning rate")

    plain = params.markdown_table(C).splitlines()
    assert plain[0] == "| parameter | type | default | meaning |" and len(plain) == 3
    assert params.markdown_table(C, {"learning_rate": "lr"}).splitlines()[2].count("`learning_rate`") == 1
    assert params.markdown_table(C, aliases_column=True).splitlines()[0].count("|") == 6
    # the train table and its family's rows share one header (with aliases: the family's rows have it too)
    rows = parameters_table("mini").splitlines()
    assert "aliases" in rows[0] and all(r.startswith("| `") for r in rows[2:])
    assert any(r.startswith("| `policy.") and " |  | " in r for r in rows)  # a family row's empty aliases cell


def test_the_facts_the_code_cites_are_in_the_repository():
    """Comments cite ``docs/FACTS.md section N``: the file is here and has every cited section."""
    import re

    facts = (REPO / "docs" / "FACTS.md").read_text(encoding="utf-8")
    sections = {int(m) for m in re.findall(r"^## (\d+)\.", facts, flags=re.M)}
    cited: dict[int, list[str]] = {}
    for path in sorted((REPO / "src").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?<![/\w])FACTS\.md", text), f"{path}: cite docs/FACTS.md (the file in the repository)"
        for m in re.finditer(r"docs/FACTS\.md sections? (\d+)(?: and (\d+))?", text):
            for n in filter(None, m.groups()):
                cited.setdefault(int(n), []).append(path.name)
    assert cited and set(cited) <= sections, {n: cited[n] for n in set(cited) - sections}


def test_one_backend_switch_for_the_train_and_evaluate_jobs(tmp_path):
    from tutorial_utils.bridge.commands import BACKEND_KEYS, split_backend
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.evaluate import chain
    from tutorial_utils.train import job as train_job

    given = {"backend": None, "steps": 3, BACKEND_KEYS[0]: "/x"}
    assert split_backend(given) == ("mini", {BACKEND_KEYS[0]: "/x"}) and given == {"steps": 3}
    for run_job in (train_job.run_job, chain.run_job):
        with pytest.raises(ConfigError, match="backend='gpu': use mini or dit4dit"):
            run_job(tmp_path / "run", backend="gpu")
