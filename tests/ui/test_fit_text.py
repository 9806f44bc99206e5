"""first_fitting: the longest wording that fits, else the shortest cut with an ellipsis."""

from rich.cells import cell_len

from chatterm.ui.fit_text import first_fitting

CHOICES = ("Assistant · SmolLM2 · session 3 · ready", "Assistant · session 3 · ready")


def test_the_longest_wording_that_fits_is_shown_whole():
    assert first_fitting(CHOICES, 80) == CHOICES[0]
    assert first_fitting(CHOICES, 30) == CHOICES[1]


def test_none_fits_the_shortest_is_cut_with_an_ellipsis_never_on_a_separator():
    # Cut by the widget, the title ended "Assistant · session 3 ·".
    assert first_fitting(CHOICES, 24) == "Assistant · session 3…"
    assert cell_len(first_fitting(CHOICES, 12)) <= 12 and first_fitting(CHOICES, 12).endswith("…")
    assert first_fitting(CHOICES, 0) == ""
