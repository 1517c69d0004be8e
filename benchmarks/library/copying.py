"""Prompts whose answers copy from the prompt: summarise a given passage, answer from a given
document, edit given code. Written for River's n-gram benchmark (`river bench ngram`), released
with River under its licence; the passages are invented, so nothing a model memorised helps."""

from __future__ import annotations

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

_INVENTORY = """\
def total_value(items):
    total = 0
    for item in items:
        total = total + item["price"] * item["quantity"]
    return total


def low_stock(items, threshold):
    result = []
    for item in items:
        if item["quantity"] < threshold:
            result.append(item["name"])
    return result


def restock(items, name, amount):
    for item in items:
        if item["name"] == name:
            item["quantity"] = item["quantity"] + amount
            return True
    return False"""

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
        f"Summarise this report for a manager, keeping every figure it gives.\n\n"
        f"{_SOLAR_REPORT}",
    ],
    "document": [
        f"Read the document and answer the question, quoting the document.\n\n{_POLICY}\n\n"
        f"Question: I used my tent on a camping trip and now want to return it. Can I, and "
        f"how do I start a return?",
        f"Read the document and answer the question using its exact words.\n\n{_LIBRARY}\n\n"
        f"Question: When is the Millbrook branch open, how long can I keep a book and a DVD, "
        f"and what do late returns cost?",
    ],
    "code": [
        f"Rewrite the following Python code so that every function has a docstring. Give the "
        f"whole code.\n\n{_INVENTORY}",
        f"Add type hints to this Python class and return the whole class.\n\n{_TEMPERATURE}",
    ],
}
"""Prompts by kind, two of each."""
