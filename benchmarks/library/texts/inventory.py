# Invented module written for River's n-gram benchmark; released under River's licence.
import json

TAX_RATE = 0.2
LOW_STOCK = 5


def load_stock(path):
    with open(path) as f:
        rows = json.load(f)
    stock = {}
    for row in rows:
        stock[row["sku"]] = {"name": row["name"], "price": row["price"], "count": row["count"]}
    return stock


def stock_value(stock):
    total = 0
    for item in stock.values():
        total += item["price"] * item["count"]
    return total


def low_items(stock):
    names = []
    for sku, item in stock.items():
        if item["count"] < LOW_STOCK:
            names.append(item["name"])
    return sorted(names)


def receive(stock, sku, count):
    if sku not in stock:
        raise KeyError(sku)
    stock[sku]["count"] += count


def place_order(stock, orders, customer, lines):
    for sku, count in lines:
        if stock[sku]["count"] < count:
            return None
    for sku, count in lines:
        stock[sku]["count"] -= count
    order = {"id": len(orders) + 1, "customer": customer, "lines": lines, "status": "open"}
    orders.append(order)
    return order


def order_total(stock, order):
    net = 0
    for sku, count in order["lines"]:
        net += stock[sku]["price"] * count
    return round(net * (1 + TAX_RATE), 2)


def cancel_order(stock, orders, order_id):
    for order in orders:
        if order["id"] == order_id and order["status"] == "open":
            order["status"] = "cancelled"
            return True
    return False


def open_orders(orders, customer):
    result = []
    for order in orders:
        if order["customer"] == customer and order["status"] == "open":
            result.append(order)
    return result
