from perfed_ray.markdown import table


def test_table_layout_and_escaping():
    text = table(["a", "b"], [[1, 0.123456], ["x|y", "two\nlines"]])
    assert text.splitlines() == [
        "| a | b |",
        "| --- | --- |",
        "| 1 | 0.123 |",
        "| x\\|y | two lines |",
    ]


def test_table_refuses_ragged_rows():
    import pytest

    with pytest.raises(ValueError, match="2 cells under a header of 3"):
        table(["a", "b", "c"], [[1, 2]])
