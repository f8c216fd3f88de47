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
