"""Calibration prompts for offline methods that need activation statistics (SmoothQuant).

The default is a short built-in text of mixed registers (prose, dialogue, code, numbers) so
that the statistics see the kinds of activations serving will; ``--tokenids-path`` replaces it
with the seed's format: token ids separated by whitespace or newlines.
"""

from __future__ import annotations

from typing import Any, Optional

DEFAULT_TEXT = """\
The river rose slowly through the spring, and by the end of April the low fields along its banks
were silver with standing water. Farmers who had planted early lost their seed; those who had
waited, as their grandparents advised, watched the water retreat and sowed in the dark, rich mud
it left behind. Nobody in the valley could remember a year without some flood, and the old stone
markers on the church wall recorded the highest of them, the oldest dated 1682.

"Are you sure the bridge will hold?" she asked, looking at the brown current.
"It held in 1947," he said, "and the water was a full metre higher then. Come on, we're late."

Photosynthesis converts light energy into chemical energy. In the chloroplasts of plant cells,
chlorophyll absorbs mostly blue and red light; the energy splits water molecules, releasing
oxygen, and drives the synthesis of glucose from carbon dioxide. The overall reaction can be
written as 6 CO2 + 6 H2O -> C6H12O6 + 6 O2, although the real process runs through dozens of steps.

def binary_search(items, target):
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1

Quarterly revenue grew 12.4% year over year to $3.82 billion, while operating margin narrowed
from 18.1% to 16.7% as the company increased spending on research and development. Management
expects full-year revenue between $15.1 and $15.6 billion and will pay a dividend of $0.42 per share.

To make bread, mix 500 g of flour, 10 g of salt, 7 g of dried yeast and 350 ml of warm water.
Knead for ten minutes until smooth, let the dough rise for an hour, shape it, let it rise again,
and bake at 220 degrees Celsius for about thirty-five minutes, until the loaf sounds hollow.

The Treaty of Westphalia, signed in 1648, ended the Thirty Years' War and is often described as
the beginning of the modern system of sovereign states. Historians still argue about how much the
treaty itself changed and how much it merely recognised changes that had already happened.

Question: What is the capital of Japan? Answer: The capital of Japan is Tokyo.
Question: How many legs does a spider have? Answer: A spider has eight legs.
User: Can you summarise the main idea of the theory of evolution in one sentence?
Assistant: Living things change over generations because individuals with traits better suited
to their environment tend to survive and reproduce more, passing those traits on.
"""


def calibration_prompts(tokenizer: Optional[Any], tokenids_path: Optional[str], chunk: int) -> list[list[int]]:
    """Token-id prompts of at most ``chunk`` tokens each, from the file or the built-in text."""
    if tokenids_path:
        with open(tokenids_path) as f:
            ids = [int(token) for token in f.read().split()]
    elif tokenizer is not None:
        ids = tokenizer(DEFAULT_TEXT, add_special_tokens=False)["input_ids"]
    else:
        raise ValueError("the model has no tokenizer: pass --tokenids-path with calibration token ids")
    if not ids:
        raise ValueError("no calibration tokens")
    return [ids[start:start + chunk] for start in range(0, len(ids), chunk)]
