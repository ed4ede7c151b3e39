"""Choosing a model from a spec and the environment, and ``durably triage --model``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _models_fakes import M1, SECRET, FakeProvider, recorded_answer, recorded_turns, serving

from _helpers.patience import stretched
from durably import ModelError, Price, Usage
from durably.models.anthropic import DEFAULT_MODEL as ANTHROPIC_DEFAULT
from durably.models.anthropic import AnthropicModel
from durably.models.openai import DEFAULT_MODEL as OPENAI_DEFAULT
from durably.models.openai import OpenAIModel
from durably.models.recorder import RecordingModel
from durably.models.replay import ReplayModel, load_recording
from durably.models.select import choose_model, resolve_spec
from durably.triage.agent import recording_path

RECORDING = recording_path(M1)
BOTH = {"ANTHROPIC_API_KEY": "sk-ant-test", "OPENAI_API_KEY": "sk-openai-test"}


def test_auto_prefers_anthropic_then_openai_then_replay() -> None:
    """With no spec, the first provider whose key is set wins; with none, the recording."""
    assert resolve_spec(None, environ=BOTH) == ("anthropic", ANTHROPIC_DEFAULT)
    assert resolve_spec("auto", environ={"OPENAI_API_KEY": "k"}) == ("openai", OPENAI_DEFAULT)
    assert resolve_spec(None, environ={"ANTHROPIC_API_KEY": ""}) == ("replay", "")
    assert resolve_spec("replay", environ=BOTH) == ("replay", "")


def test_auto_with_a_key_builds_that_provider_with_that_key() -> None:
    """The key and base URL come from the environment given, not from the process's."""
    environ = {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    model = choose_model(None, recording=RECORDING, environ=environ)
    assert isinstance(model, AnthropicModel)
    assert model.name == ANTHROPIC_DEFAULT
    assert model.client.api_key == "sk-ant-test"
    assert str(model.client.base_url).startswith("http://127.0.0.1:9")
    assert model.client.max_retries == 0


def test_named_models_and_the_replay() -> None:
    """anthropic:M and openai:M name the model; replay plays the recording; no key, no network."""
    claude = choose_model("anthropic:claude-sonnet-4-5", environ=BOTH)
    gpt = choose_model("openai:gpt-4.1-mini", environ=BOTH)
    replay = choose_model(None, recording=RECORDING, environ={})
    assert (type(claude), claude.name) == (AnthropicModel, "claude-sonnet-4-5")
    assert (type(gpt), gpt.name) == (OpenAIModel, "gpt-4.1-mini")
    assert isinstance(replay, ReplayModel)
    assert replay.name == load_recording(RECORDING).model


@pytest.mark.parametrize(
    ("spec", "environ", "says"),
    [
        ("gemini:pro", BOTH, "unknown model 'gemini:pro'"),
        ("openai:", BOTH, "unknown model"),
        ("openai:gpt-4.1", {"ANTHROPIC_API_KEY": "k"}, "OPENAI_API_KEY is not set"),
        ("anthropic:claude-imaginary-9", BOTH, "no price for model"),
        ("replay", {}, "no recording to replay"),
        ("openai:gpt-imaginary", {**BOTH, "DURABLY_PRICE": "cheap"}, "is not a price"),
    ],
)
def test_bad_choices_are_model_errors_with_a_remedy(
    spec: str, environ: dict[str, str], says: str
) -> None:
    """Every way a choice can fail raises ModelError saying what to do."""
    with pytest.raises(ModelError, match=says):
        choose_model(spec, environ=environ)


def test_durably_price_prices_a_model_the_table_does_not_know() -> None:
    """DURABLY_PRICE=IN,OUT (dollars per million tokens) prices any model."""
    model = choose_model("openai:gpt-imaginary", environ={**BOTH, "DURABLY_PRICE": "3,15"})
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert model.dollars(usage) == pytest.approx(18.0)
    explicit = choose_model("openai:gpt-imaginary", environ=BOTH, price=Price(input=1, output=1))
    assert explicit.dollars(usage) == pytest.approx(2.0)


def test_record_to_wraps_provider_models_only(tmp_path: Path) -> None:
    """A provider model is recorded under its own name; a replay is never re-recorded."""
    target = tmp_path / "recording.json"
    recorded = choose_model("anthropic", environ=BOTH, record_to=target)
    replay = choose_model("replay", recording=RECORDING, environ=BOTH, record_to=target)
    assert isinstance(recorded, RecordingModel)
    assert recorded.name == ANTHROPIC_DEFAULT
    assert isinstance(replay, ReplayModel)


def test_importing_durably_and_its_adapters_imports_no_sdk() -> None:
    """The SDKs are imported when a provider model is built, not by ``import durably``."""
    code = (
        "import sys, durably, durably.models.anthropic, durably.models.openai, "
        "durably.models.select, durably.models.recorder, durably.triage.cli; "
        "print(sorted(m for m in ('anthropic', 'openai') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=stretched(60),
    )
    assert done.stdout.strip() == "[]"


def triage(state: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``durably triage`` on ``state`` with the environment ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "durably", "triage", "--state", str(state), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=stretched(60),
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without provider keys, plus ``extra``."""
    drop = {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"}
    return {
        **{k: v for k, v in os.environ.items() if k not in drop},
        "COLUMNS": "200",
        **extra,
    }


def test_cli_refuses_an_unusable_model_before_starting_a_run(tmp_path: Path) -> None:
    """A bad --model exits 2 with the remedy and leaves no world or run behind."""
    unknown = triage(tmp_path, "--model", "gemini:pro", env=clean_env())
    keyless = triage(tmp_path, "--model", "anthropic", env=clean_env())
    assert unknown.returncode == keyless.returncode == 2
    assert "anthropic[:MODEL]" in unknown.stderr
    assert "ANTHROPIC_API_KEY is not set" in keyless.stderr
    assert not list((tmp_path / "worlds").glob("*"))


def test_cli_runs_m1_against_a_provider_and_records_it(tmp_path: Path) -> None:
    """--model anthropic:M drives m1 to 16/16 and leaves a key-free recording in the world."""
    fake = FakeProvider("anthropic", recorded_answer("anthropic", recorded_turns()))
    with serving(fake):
        env = clean_env(ANTHROPIC_API_KEY=SECRET, ANTHROPIC_BASE_URL=fake.base_url)
        done = triage(
            tmp_path, "--model", "anthropic:claude-haiku-4-5", "--approve", "off", env=env
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16/16 checks passed" in done.stdout
    (world,) = (tmp_path / "worlds").iterdir()
    recording = (world / "recording.json").read_text()
    assert SECRET not in recording
    assert fake.base_url not in recording
    document = json.loads(recording)
    assert document["model"] == "claude-haiku-4-5"
    assert len(document["turns"]) == len(recorded_turns())
