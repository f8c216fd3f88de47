"""``oprl serve``: the command line hook and the server's options (no server is started here)."""

import pytest

pytest.importorskip("tinker")

from oprl.cli import main
from oprl.errors import OprlError
from oprl.serve.tinker import build_server
from oprl.serve.tinker.cli import main as serve_main


def test_serve_needs_the_api_name(capsys):
    assert main(["serve"]) == 2
    assert "oprl serve tinker --help" in capsys.readouterr().err


def test_a_public_address_needs_an_api_key(capsys):
    assert main(["serve", "tinker", "--host", "0.0.0.0"]) == 2
    assert "--api-key" in capsys.readouterr().err


def test_models_map_names_to_paths_and_bad_entries_are_one_line(tmp_path):
    server = build_server(models=["mine=/some/dir", "tiny=tiny"], state_dir=tmp_path)
    assert server.backend.table.entries["mine"] == "/some/dir"
    assert server.backend.table.entries["oprl/tiny"] == "tiny"  # the built-in table stays
    with pytest.raises(OprlError, match="--model: 'nopath' is not NAME=PATH"):
        build_server(models=["nopath"], state_dir=tmp_path)
    with pytest.raises(OprlError, match="expected key=value"):
        serve_main(["tinker", "steps"])


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"sample_window_ms": -1}, "--sample-window-ms"),
        ({"batch_rows": 0}, "--batch-rows"),
        ({"threads": 0}, "--threads"),
        ({"workers": "gpus"}, "--workers"),
        ({"workers": "processes", "gpus_per_model": -1}, "--gpus-per-model"),
    ],
)
def test_bad_batching_and_placement_options_are_one_line_naming_the_option(tmp_path, options, field):
    with pytest.raises(OprlError, match=field):
        build_server(state_dir=tmp_path, **options)


def test_threads_and_batching_options_reach_the_server(tmp_path):
    server = build_server(state_dir=tmp_path, threads=1, sample_window_ms=25, batch_rows=64)
    assert (server.threads, server.sample_window, server.batch_rows) == (1, 0.025, 64)
    assert server.lane("compute").submit(lambda: __import__("torch").get_num_threads()).result() == 1
