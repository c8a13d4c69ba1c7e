"""The torch thread count the notebooks and ``grpo-lab`` pick: the cores the load leaves free, unless told."""

import pytest
import torch

from grpo_lab import cli, threads
from grpo_lab.threads import choose_threads


@pytest.mark.parametrize("cores, load, expected", [(2, 0.0, 2), (2, 1.69, 1), (2, 5.0, 1), (16, 3.2, 13),
                                                   (8, 7.6, 1), (8, 0.4, 8)])
def test_the_free_cores_at_least_one(cores, load, expected):
    choice = choose_threads(cores=cores, load=load, environ={})
    assert choice.threads == expected
    assert f"{cores} cores minus the 1-minute load {load:.2f}, at least 1" in str(choice)


def test_omp_num_threads_and_an_explicit_number_win_over_the_load():
    assert choose_threads(cores=16, load=0.0, environ={"OMP_NUM_THREADS": "3"}).threads == 3
    assert "OMP_NUM_THREADS=3" in str(choose_threads(cores=16, load=0.0, environ={"OMP_NUM_THREADS": "3"}))
    assert choose_threads(5, cores=2, load=9.0, environ={"OMP_NUM_THREADS": "3"}).threads == 5


@pytest.mark.parametrize("given", ["0", "two", "-1", "1.5"])
def test_an_unusable_omp_num_threads_is_named_and_the_load_decides(given):
    choice = choose_threads(cores=4, load=1.0, environ={"OMP_NUM_THREADS": given})
    assert choice.threads == 3 and f"OMP_NUM_THREADS={given!r} is not a whole number" in str(choice)


@pytest.mark.parametrize("requested", [0, -2, 1.5, True])
def test_a_requested_count_below_one_or_not_whole_is_refused(requested):
    with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
        choose_threads(requested)


def test_the_cli_says_which_count_it_uses_and_why(monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.6, 0.0, 0.0))
    monkeypatch.setattr(threads, "available_cores", lambda: 3)
    monkeypatch.setattr(cli, "_train", lambda config, progress, resume: 0)
    assert cli.main(["train", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "grpo-lab train: torch threads: 2 (3 cores minus the 1-minute load 0.60" in err
    assert torch.get_num_threads() == 2
    assert cli.main(["train", "--quiet", "--threads", "1"]) == 0
    assert "grpo-lab train: torch threads: 1 (as asked)" in capsys.readouterr().err and torch.get_num_threads() == 1


def test_the_cli_refuses_threads_below_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--threads", "0"])
    assert exit_.value.code == 2 and "--threads: threads must be a whole number >= 1" in capsys.readouterr().err
