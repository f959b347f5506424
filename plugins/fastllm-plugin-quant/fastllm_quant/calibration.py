"""Calibration prompts for offline methods that need activation statistics (SmoothQuant, GPTQ).

The default is a built-in text of mixed registers (prose, dialogue, letters, code, numbers, a
little French, German and Spanish), written for this project, so that the statistics see the
kinds of activations serving will; about 3,000 tokens, enough for GPTQ's Hessians of layers with
up to a few thousand inputs. ``--tokenids-path`` replaces it with the seed's format: token ids
separated by whitespace or newlines.
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
The lighthouse keeper kept a log in a green ledger. Most entries were short: the wind, the state of
the sea, the ships that passed and the hours the lamp was lit. On the night of the ninth of
November the entry runs to two pages. A fishing boat had lost its engine off the northern reef, and
for three hours the keeper and his daughter signalled to it with a hand lamp while the tide turned
and the boat drifted closer to the rocks. At a quarter past two a lifeboat from the harbour reached
it; the last line of the entry, in a shakier hand than the rest, says only "All six safe. Tea."

Dear Mrs. Okafor,
Thank you for your letter of 3 March and for the photographs of the garden wall. I have spoken to
the builder, who agrees that the new mortar is the wrong colour and will replace it at no charge
in the week of 17 April, weather permitting. Please let me know if that week does not suit you.
Yours sincerely,
Daniel Hart, Site Manager

How vaccines work, in brief: the immune system learns to recognise a pathogen by the shapes of
molecules on its surface, called antigens. A vaccine presents those antigens, or the instructions
for making them, without the pathogen that causes the disease. B cells respond by producing
antibodies and T cells by learning to find and destroy infected cells; some of both remain as
memory cells for years, so that a later infection is met within days rather than weeks.

SELECT customer_id, COUNT(*) AS orders, SUM(total) AS revenue
FROM orders
WHERE created_at >= '2023-01-01' AND status <> 'cancelled'
GROUP BY customer_id
HAVING COUNT(*) > 3
ORDER BY revenue DESC
LIMIT 20;

class LRUCache {
  constructor(capacity) {
    this.capacity = capacity;
    this.map = new Map();
  }
  get(key) {
    if (!this.map.has(key)) return undefined;
    const value = this.map.get(key);
    this.map.delete(key);
    this.map.set(key, value);
    return value;
  }
  put(key, value) {
    this.map.delete(key);
    this.map.set(key, value);
    if (this.map.size > this.capacity) this.map.delete(this.map.keys().next().value);
  }
}

The market opened in darkness. By five the first vans had backed up to the stalls, and men in
aprons were stacking crates of lemons, aubergines and pale green figs. A woman sold coffee from a
cart with a brass urn, and the porters drank it standing, steam rising from the paper cups. By
seven the crowds had arrived: cooks from the restaurants with their lists, grandmothers who
tested every melon twice, students looking for whatever was cheapest at the end of the day.

Let f(x) = x^2 - 4x + 3. Setting f(x) = 0 and factoring gives (x - 1)(x - 3) = 0, so the roots
are x = 1 and x = 3. The vertex lies halfway between them, at x = 2, where f(2) = 4 - 8 + 3 = -1.
The derivative f'(x) = 2x - 4 vanishes at the same point, which confirms that the minimum of f is
-1. The area between the curve and the x-axis from 1 to 3 is the integral of -f, which equals 4/3.

User: My tomato plants have yellow leaves at the bottom. Should I worry?
Assistant: A few yellow leaves low on the plant are normal as it grows, because the plant moves
nutrients to new growth. If the yellowing spreads upward, check the watering first: both too much
and too little water cause it. Pale leaves with green veins often mean a lack of magnesium, and
brown spots with rings suggest early blight, which spreads in wet weather; remove the affected
leaves and water the soil rather than the foliage.
User: Thanks! How often should I water them?
Assistant: Deeply, about twice a week in mild weather and every day or two in a heat wave, so that
the soil stays evenly moist a few centimetres down. Pots dry out faster than beds.

The committee met on Tuesday and approved the budget for the new library by seven votes to two.
Construction will begin in the autumn and is expected to take eighteen months. The building will
have a children's floor, a room for local history archives, twelve study rooms and a roof terrace.
Opponents argued that the money would be better spent repairing the swimming pool, which has been
closed since a leak was found in its filtration system last year.

Steps to replace a bicycle inner tube:
1. Shift to the smallest rear sprocket, open the brake and remove the wheel.
2. Let out any remaining air and push the valve up into the tyre.
3. Use two tyre levers to lift one side of the tyre over the rim, then pull out the old tube.
4. Run your fingers carefully around the inside of the tyre to find the thorn or glass.
5. Inflate the new tube slightly, fit the valve through the rim and tuck the tube into the tyre.
6. Push the tyre back over the rim with your thumbs, inflate to the pressure on the sidewall,
   and refit the wheel.

In the winter of 1816 the weather across much of Europe and North America was unusually cold; it
is remembered as the year without a summer. Frost killed crops in June, snow fell in New England
in July, and food prices rose sharply. The cause, understood only much later, was the eruption of
Mount Tambora in Indonesia the year before, which threw so much ash and sulphur into the upper
atmosphere that it dimmed the sunlight reaching the ground for more than a year.

import numpy as np

def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    # the mean of each run of `window` consecutive values
    if window <= 0:
        raise ValueError("window must be positive")
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")

print(moving_average(np.arange(10, dtype=float), 3))  # [1. 2. 3. 4. 5. 6. 7. 8.]

Ce matin, le train pour Lyon est parti avec vingt minutes de retard. Les voyageurs attendaient sur
le quai, leurs cafés à la main, pendant qu'une voix annonçait des excuses. Der Zug nach München
hatte dagegen keine Verspätung. En la estación, un niño preguntó a su madre por qué los trenes no
pueden adelantarse unos a otros, y ella le explicó que comparten la misma vía.

Sound travels at about 343 metres per second in air at 20 degrees Celsius, roughly 1,480 metres per
second in water and more than 5,000 metres per second in steel. Light, by comparison, covers about
300,000 kilometres every second in a vacuum. That is why we see a distant lightning flash before
we hear the thunder: counting the seconds between them and dividing by three gives the distance
to the storm in kilometres.

"I don't understand why you kept it," he said, turning the old key over in his hand.
"Because it opened the door of the first flat we ever rented," she answered. "The one with the
leaking roof and the neighbour who played the trumpet at midnight."
"We were happy there."
"We were. Put it back in the drawer."

Table 3. Average monthly rainfall (mm) and temperature (°C)
Month     Rainfall   Max   Min
January   78         6     1
April     54         14    5
July      49         23    14
October   82         15    8

A good password is long rather than clever. Four or five unrelated words are easier to remember
than a short string of symbols and much harder to guess. Use a different password for every
account, keep them in a password manager, and turn on two-factor authentication wherever it is
offered, so that a stolen password alone is not enough to get in.

The small grey bird on the fence is a dunnock. It looks plain, but its song is a quick, bright
warble, and it spends most of its time under hedges, shuffling through the leaves for insects and
seeds. In spring the males chase each other around the garden in short, noisy flights.

Why does bread go stale? Not mainly because it dries out. As bread cools, the starch molecules that
the heat of the oven had loosened slowly line up again into crystals, and the crumb turns firm and
crumbly. This happens fastest at refrigerator temperatures, which is why bread kept in the fridge
goes stale sooner than bread left on the counter; warming stale bread in the oven undoes some of
the change for a little while.

Meeting notes, 14 June
Present: Priya, Tom, Elena, Marcus (minutes)
- The release moves from 30 June to 7 July: two bugs in the export feature are still open.
- Elena will write the migration guide; draft due Friday.
- Tom reported that the nightly tests take 41 minutes; he proposes splitting them into two jobs.
- Next meeting: 21 June, 10:00, room 4B.

Once upon a time a fox found a well in the middle of a field. Looking down, he saw the moon
floating on the water, round and white like a cheese. "That will make a fine supper," he said,
and he climbed into the bucket to fetch it. Down he went, and when he reached the water the moon
broke into a hundred pieces and the fox was left sitting in the cold, wet bucket, calling for
someone to pull him up. A goat came by and asked what he was doing there.

$ git log --oneline -3
9f2c1ab Fix off-by-one error in pagination
4e7d0c2 Add retry with backoff to the upload client
1b33f90 Update README with installation steps
$ ls -la build/
total 16
drwxr-xr-x  2 dev dev 4096 Mar  2 09:14 .
drwxr-xr-x 11 dev dev 4096 Mar  2 09:13 ..
-rw-r--r--  1 dev dev 2210 Mar  2 09:14 report.html
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
