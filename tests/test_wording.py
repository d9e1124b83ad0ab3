"""Counts in messages agree with their nouns."""

from structnmt.data.stream import _long_line_warning
from structnmt.wording import counted


def test_counted_nouns() -> None:
    assert [counted(n, "sentence") for n in (0, 1, 2, 12345)] == \
        ["0 sentences", "1 sentence", "2 sentences", "12,345 sentences"]
    assert counted(1, "child", "children") == "1 child" and counted(3, "child", "children") == "3 children"


def test_one_long_evaluation_line_is_one_pair() -> None:
    one = _long_line_warning([10], 8, "test.en")
    assert one is not None and one.startswith("1 pair longer than data.clean.max_len (8 words) is kept")
    assert "line 10 of test.en" in one
    two = _long_line_warning([3, 10], 8, "test.en")
    assert two is not None and two.startswith("2 pairs longer") and "are kept" in two and "lines 3, 10 of" in two


def test_a_validation_line_gives_bleu_in_points(tmp_path, capsys) -> None:
    from structnmt.training.logger import RunLogger

    logger = RunLogger(tmp_path, tensorboard=False, progress=False)
    logger.log("valid", {"step": 40, "nll": 5.123456, "bleu": 3.444e-68, "best": 12.3456}, best_of="bleu")
    # the best of the loss (early_stopping_metric: loss) is a loss, in its own digits
    logger.log("valid", {"step": 80, "loss": 0.004567, "bleu": 1.5, "best": 0.004567}, best_of="loss")
    logger.close()
    assert capsys.readouterr().err.strip().splitlines() == ["step=40 nll=5.123 bleu=0.00 best=12.35",
                                                            "step=80 loss=0.004567 bleu=1.50 best=0.004567"]
