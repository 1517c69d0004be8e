"""Prompts whose answers copy from the prompt, for River's n-gram benchmark (`river bench ngram`),
by the kind of request a user sends:

- summary: summarise the bundled handbook, one of its sections or a short passage given in full.
- rag: answer a question from a document given in full, quoting it (retrieval-augmented style).
- extraction: pull structured data (JSON, tables, CSV, numbered steps) out of the handbook.
- code: edit the bundled Python module and give the whole edited file back.
- translation: translate a short passage into French, Spanish, German, Italian or Portuguese;
  only names and numbers copy, so n-gram drafts find little here.

The handbook (`texts/handbook.md`), the module (`texts/inventory.py`) and the passages below are
invented for this benchmark, so nothing a model memorised helps; they are bundled and released
with River under its licence."""

from __future__ import annotations

from pathlib import Path

_TEXTS = Path(__file__).with_name("texts")


def _bundled(name: str) -> str:
    """The text of `texts/name` without its first line, the note on where it comes from."""
    return (_TEXTS / name).read_text().split("\n", 1)[1].strip()


_HANDBOOK = _bundled("handbook.md")
"""The staff handbook of an invented water board, about 830 words in 8 numbered sections."""

_HANDBOOK_SECTIONS = {int(part.split(".", 1)[0]): f"## {part.strip()}"
                      for part in _HANDBOOK.split("\n## ")[1:]}
"""Each section of the handbook, heading included, by its number."""

_INVENTORY = _bundled("inventory.py")
"""An invented stock and order-book module, 8 functions without docstrings or type hints."""

_RIVER_TOWN = """\
The town of Harlow Bend grew up around a ferry crossing on the Esk River in 1821. For forty \
years the ferry was the only way across, and the ferryman, Thomas Alder, kept a ledger of \
every passenger, cart and animal he carried. In 1862 the county built a stone bridge two \
miles upstream, and the ferry closed the following spring. The town did not shrink, as many \
expected: the bridge brought a weekly market, and by 1880 Harlow Bend had three mills, a \
school for ninety children and a railway halt on the line from Carrow to the coast. The \
great flood of 1903 destroyed two of the mills and the lower streets, and the town rebuilt \
on the higher ground to the east, where the market square stands today. Alder's ledger \
survived the flood in the attic of the old toll house and is now kept in the county \
archive, where it is the oldest record of daily life in the valley."""

_SOLAR_REPORT = """\
The pilot solar array at the Keswick depot ran for twelve months, from March to February. \
It has 240 panels with a rated capacity of 96 kilowatts. Over the year it produced 101 \
megawatt hours, which covered 38 percent of the depot's electricity use. Output was highest \
in June, at 14.2 megawatt hours, and lowest in December, at 2.1 megawatt hours. Two \
inverters failed in August and were replaced under warranty within nine days; the lost \
output in that period was estimated at 1.3 megawatt hours. Cleaning the panels twice a \
year raised output by about 4 percent in the weeks after each cleaning. The project team \
recommends extending the array to the roof of the north workshop, which would add 120 \
panels, and fitting a battery of 200 kilowatt hours so that midday surplus can cover the \
evening shift."""

_POLICY = """\
Returns policy of Fenwick Outdoor Supplies.
1. Unused items may be returned within 30 days of delivery for a full refund to the \
original payment method.
2. Items that have been used may be returned within 14 days if they are faulty; we will \
repair, replace or refund them at our choice.
3. Tents, sleeping bags and footwear that have been used outdoors cannot be returned unless \
they are faulty.
4. Sale items marked "final sale" cannot be returned or exchanged.
5. To start a return, email returns@fenwick.example with your order number and a photo of \
the item. We will send a prepaid label within two working days.
6. Refunds are issued within 5 working days after the item reaches our warehouse in Leeds.
7. Gift cards cannot be refunded or exchanged for cash."""

_LIBRARY = """\
Westfield Public Library: opening hours and services.
The main library on Carter Street is open Monday to Friday from 9 am to 8 pm, Saturday from \
10 am to 5 pm, and closed on Sunday. The branch library in Millbrook is open Tuesday, \
Thursday and Saturday from 10 am to 4 pm. Members may borrow up to 12 items at a time. \
Books are lent for three weeks and may be renewed twice online or by phone, unless another \
member has reserved them. DVDs are lent for one week and cannot be renewed. Late returns \
cost 20 cents a day per item, up to a maximum of 5 dollars per item. The study rooms on the \
second floor can be booked for up to two hours a day at the front desk. Free wireless \
internet is available in both libraries; the network name is WPL-Public and no password \
is needed. Printing costs 10 cents a page in black and white and 50 cents in colour."""

_SCHOOL_LETTER = """\
Dear parents, on Thursday 12 June the children of Year 4 at Linden Row Primary School will \
visit the Halloway Museum of Clocks in Brenford. The coach leaves the school gate at 8:45 am \
and returns by 3:15 pm. The trip costs £14 per child, which covers the coach and the museum's \
workshop, where each child will build a small sundial to bring home. Please pay through the \
school app by Friday 30 May. Children should bring a packed lunch, a bottle of water and a \
coat, as part of the visit is outdoors. If your child needs medicine during the day, please \
tell Mrs Adeyemi in the school office."""

_MARKET_NOTICE = """\
From Saturday 6 May the Oxlade farmers' market moves from Quay Street to the car park behind \
St Aldric's Hall, while the street is being repaved. The market keeps its usual hours, from \
8 am to 1 pm every Saturday, and all 32 stalls will move with it. Parking for shoppers will be \
free at the leisure centre on Mill Road, a five-minute walk away. Stallholders can unload from \
6:30 am using the side gate on Fern Lane. The market is expected to return to Quay Street in \
late August; the date will be posted on the town council's website."""

_FERRY_TIMETABLE = """\
The ferry from Port Elsin to the island of Caddow runs four times a day from April to \
October, leaving at 8:00, 11:00, 14:30 and 17:30, and twice a day in winter, at 9:00 and \
15:00. The crossing takes 50 minutes. A return ticket costs £18 for adults and £9 for \
children under 12; bicycles travel free, but cars must be booked at least two days ahead. \
In strong winds the captain may cancel a sailing, and passengers are told by text message \
an hour before departure. The café on board serves hot drinks and sandwiches."""

_KETTLE_CARE = """\
Caring for your Brightwell K2 kettle. Before first use, fill the kettle to the MAX line, boil \
the water and pour it away; do this twice. Never fill the kettle above the MAX line or below \
the MIN line, and always switch it off at the wall before cleaning. To remove limescale, fill \
the kettle halfway with equal parts of water and white vinegar, leave it for one hour, then \
boil it, pour it away and rinse twice with clean water. The filter at the spout lifts out \
and can be washed under the tap. The kettle has a two-year guarantee from the date of \
purchase."""

_CLINIC_NOTICE = """\
The Saltmarsh Lane health clinic will be closed on Monday 3 and Tuesday 4 March while new \
computer systems are installed. During those two days, patients who need to see a doctor \
urgently should go to the clinic on Brook Parade, which will stay open until 8 pm. Repeat \
prescriptions ordered before Friday 28 February will be ready on Wednesday 5 March as usual. \
From that Wednesday, patients will be able to book appointments online, up to four weeks \
ahead, as well as by phone on 01632 960 777."""

_TEMPERATURE = """\
class Thermometer:
    def __init__(self, name, readings):
        self.name = name
        self.readings = readings

    def average(self):
        return sum(self.readings) / len(self.readings)

    def highest(self):
        return max(self.readings)

    def lowest(self):
        return min(self.readings)

    def report(self):
        print("Thermometer:", self.name)
        print("Average:", self.average())
        print("Highest:", self.highest())
        print("Lowest:", self.lowest())"""

COPYING = {
    "summary": [
        f"Summarise the following passage in a few sentences, keeping its names, dates and "
        f"numbers.\n\n{_RIVER_TOWN}",
        f"Summarise the following document in a few sentences, keeping its names, dates and "
        f"numbers.\n\n{_HANDBOOK}",
        f"List every procedure described in this handbook as bullet points, one bullet per step, "
        f"keeping the times and limits it gives.\n\n{_HANDBOOK}",
        f"I start work at this water board next week. Summarise its handbook for me: who is who, "
        f"where I go, who I call and what rules I must know.\n\n{_HANDBOOK}",
        f"Summarise only section 5 of the handbook below, keeping every number.\n\n{_HANDBOOK}",
        f"Summarise this section of our handbook in one paragraph for a new duty controller."
        f"\n\n{_HANDBOOK_SECTIONS[4]}",
        f"Summarise the document below section by section: keep each heading and write one or two "
        f"sentences under it.\n\n{_HANDBOOK}",
        f"Summarise this report for a manager, keeping every figure it gives.\n\n"
        f"{_SOLAR_REPORT}",
    ],
    "rag": [
        f"Answer the question from the document below, quoting it where you can.\n\n{_HANDBOOK}"
        f"\n\nQuestion: A pipe has burst and water is coming into a house. What priority does the "
        f"job get, how soon must a crew be there, and when can the job be closed?",
        f"Answer the question from the document below, quoting it where you can.\n\n{_HANDBOOK}"
        f"\n\nQuestion: I have worked here for six years. How many days of annual leave do I get, "
        f"and how far ahead must I ask for a two-week holiday?",
        f"Answer the question from the document below, quoting it where you can.\n\n{_HANDBOOK}"
        f"\n\nQuestion: I drove 10,000 miles on Board business this year and had two dinners away. "
        f"What can I claim, and by when?",
        f"Answer the question from the document below, quoting it where you can.\n\n{_HANDBOOK}"
        f"\n\nQuestion: Who do I contact about my pay, and how? And who about a safety incident?",
        f"Answer the question from the document below, quoting it where you can.\n\n{_HANDBOOK}"
        f"\n\nQuestion: What must be done before anyone goes into a valve chamber, and what "
        f"happens if the gas alarm goes off?",
        f"Answer the question from the document below, quoting it where you can.\n\n{_HANDBOOK}"
        f"\n\nQuestion: Can the public visit the Millcote Treatment Works, and when is the head "
        f"office front desk open on a Saturday?",
        f"Read the document and answer the question, quoting the document.\n\n{_POLICY}\n\n"
        f"Question: I used my tent on a camping trip and now want to return it. Can I, and "
        f"how do I start a return?",
        f"Read the document and answer the question using its exact words.\n\n{_LIBRARY}\n\n"
        f"Question: When is the Millbrook branch open, how long can I keep a book and a DVD, "
        f"and what do late returns cost?",
    ],
    "extraction": [
        f"Extract every date in the document below with the event it belongs to, as a JSON list "
        f"of objects with the keys \"date\" and \"event\".\n\n{_HANDBOOK}",
        f"Make a Markdown table of every phone number and e-mail address in the document below, "
        f"with the columns Who, Phone and E-mail.\n\n{_HANDBOOK}",
        f"Copy the steps for reporting a burst main from the document below as a numbered list, "
        f"word for word.\n\n{_HANDBOOK}",
        f"Give the expense rates in this section as CSV with the columns item, amount, unit and "
        f"condition.\n\n{_HANDBOOK_SECTIONS[6]}",
        f"List every person named in the document below as JSON objects with the keys \"name\", "
        f"\"role\" and, where given, \"phone\" and \"email\".\n\n{_HANDBOOK}",
        f"Turn the confined-space rules below into a JSON object with a key \"before_entry\" "
        f"(a list of the steps) and a key \"rules\" (a list of the other rules, each one sentence "
        f"copied from the text).\n\n{_HANDBOOK_SECTIONS[7]}",
        f"Make a table of the opening hours of each site in the document below, with the columns "
        f"Site, Address, Days and Hours.\n\n{_HANDBOOK}",
        f"Extract from the document below the three job priorities as a JSON object mapping each "
        f"priority letter to its condition and the time a crew has to reach the site."
        f"\n\n{_HANDBOOK}",
    ],
    "code": [
        f"Add a docstring to every function in this Python module. Give the whole file back."
        f"\n\n{_INVENTORY}",
        f"Add type hints to every function in this Python module and give the whole edited file."
        f"\n\n{_INVENTORY}",
        f"Rename the variable `stock` to `inventory` everywhere in this module, parameters "
        f"included, and give the whole file back.\n\n{_INVENTORY}",
        f"In this module, make `receive` raise a ValueError unless `count` is a positive integer, "
        f"and leave the rest as it is. Give the whole file.\n\n{_INVENTORY}",
        f"Rewrite the loops in `stock_value`, `low_items` and `open_orders` as comprehensions. "
        f"Give the whole module back, otherwise unchanged.\n\n{_INVENTORY}",
        f"Add logging to this module: a module-level logger, and an info message whenever stock "
        f"is received, an order is placed or an order is cancelled. Give the whole file."
        f"\n\n{_INVENTORY}",
        f"There is a bug in this module: `cancel_order` marks the order cancelled but never puts "
        f"its items back in stock. Fix it and give the whole corrected file.\n\n{_INVENTORY}",
        f"Add a function `customer_spend(stock, orders, customer)` after `open_orders` that "
        f"returns the total, tax included, of the customer's orders that are not cancelled. "
        f"Give the whole file.\n\n{_INVENTORY}",
        f"Add type hints to this Python class and return the whole class.\n\n{_TEMPERATURE}",
    ],
    "translation": [
        f"Translate this section of a staff handbook into French.\n\n{_HANDBOOK_SECTIONS[2]}",
        f"Translate this letter to parents into Spanish.\n\n{_SCHOOL_LETTER}",
        f"Translate the following notice into German.\n\n{_MARKET_NOTICE}",
        f"Translate this timetable note into Italian.\n\n{_FERRY_TIMETABLE}",
        f"Translate this section of a staff handbook into Portuguese.\n\n"
        f"{_HANDBOOK_SECTIONS[1]}",
        f"Translate these care instructions into French.\n\n{_KETTLE_CARE}",
        f"Translate this section of a staff handbook into German.\n\n{_HANDBOOK_SECTIONS[6]}",
        f"Translate the following notice into Portuguese.\n\n{_CLINIC_NOTICE}",
    ],
}
"""Prompts by kind, at least 8 of each; the first of "summary" summarises a short passage."""

KINDS = tuple(COPYING)
"""The kinds of copying prompt, in order."""
