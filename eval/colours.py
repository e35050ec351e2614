"""The labels' colours: one home for the HTML view (`stepgap view`) and the PNG plots
(`stepgap eval`), so a label looks the same in both."""

from __future__ import annotations

# label -> (its colour, a light background of the same hue)
LABEL_COLOURS = {
    "no_gap": ("#1e7b34", "#e6f4ea"),
    "CC": ("#c62828", "#fde7e7"),
    "IE": ("#d66a00", "#fff1dc"),
    "MB": ("#5e35b1", "#ece6f8"),
}


def css_variables() -> str:
    """The colours as the view's CSS variables (`--MB-fg`, `--MB-bg`, ...)."""
    pairs = "".join(
        f"  --{label}-fg: {fg}; --{label}-bg: {bg};\n" for label, (fg, bg) in LABEL_COLOURS.items()
    )
    return f":root {{\n{pairs}}}\n"
