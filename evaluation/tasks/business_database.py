"""The text-to-SQL task's database: a small business (departments, employees, customers, products,
orders, order items), created by code, never shipped as a binary.

Prices and salaries are integers, so sums do not depend on the order rows are added in. A few rows
exist to make questions non-trivial: a department without employees, customers without orders,
products never ordered or out of stock, orders that are pending or cancelled.

`database_path()` builds the file once in a cache folder, named by a fingerprint of the content
below, so every process reads the same file and a changed content gets a new file.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

from smc_jax.models.weights_cache import cache_root

DATABASE_NAME = "business"
CACHE_SUBFOLDER = "tasks"
FINGERPRINT_CHARS = 16

SCHEMA_SQL = """
CREATE TABLE departments (
  department_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  location TEXT NOT NULL,
  budget INTEGER NOT NULL
);
CREATE TABLE employees (
  employee_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  department_id INTEGER NOT NULL REFERENCES departments (department_id),
  manager_id INTEGER REFERENCES employees (employee_id),
  title TEXT NOT NULL,
  salary INTEGER NOT NULL,
  hire_date TEXT NOT NULL
);
CREATE TABLE customers (
  customer_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  city TEXT NOT NULL,
  country TEXT NOT NULL,
  signup_date TEXT NOT NULL
);
CREATE TABLE products (
  product_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  category TEXT NOT NULL,
  unit_price INTEGER NOT NULL,
  units_in_stock INTEGER NOT NULL
);
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  customer_id INTEGER NOT NULL REFERENCES customers (customer_id),
  employee_id INTEGER NOT NULL REFERENCES employees (employee_id),
  order_date TEXT NOT NULL,
  status TEXT NOT NULL
);
CREATE TABLE order_items (
  order_id INTEGER NOT NULL REFERENCES orders (order_id),
  product_id INTEGER NOT NULL REFERENCES products (product_id),
  quantity INTEGER NOT NULL,
  PRIMARY KEY (order_id, product_id)
);
"""

ROWS: dict[str, list[tuple]] = {
    "departments": [
        (1, "Sales", "London", 500000),
        (2, "Engineering", "Berlin", 900000),
        (3, "Marketing", "London", 300000),
        (4, "Support", "Madrid", 200000),
        (5, "Finance", "Paris", 250000),
        (6, "Research", "Berlin", 400000),
    ],
    "employees": [
        (1, "Alice Moreau", 1, None, "Sales Director", 120000, "2015-03-01"),
        (2, "Bruno Keller", 2, None, "CTO", 150000, "2014-07-15"),
        (3, "Chloe Martin", 3, None, "Marketing Lead", 95000, "2016-01-10"),
        (4, "Diego Ruiz", 4, None, "Support Manager", 80000, "2017-05-22"),
        (5, "Elena Rossi", 5, None, "CFO", 130000, "2015-09-30"),
        (6, "Farid Haddad", 1, 1, "Account Executive", 70000, "2018-02-12"),
        (7, "Greta Lindqvist", 1, 1, "Account Executive", 72000, "2019-06-03"),
        (8, "Hugo Bernard", 1, 1, "Sales Associate", 52000, "2021-08-16"),
        (9, "Ines Duarte", 2, 2, "Senior Engineer", 110000, "2016-11-07"),
        (10, "Jonas Weber", 2, 2, "Engineer", 88000, "2019-03-18"),
        (11, "Kaito Sato", 2, 9, "Engineer", 91000, "2020-01-06"),
        (12, "Lena Fischer", 2, 9, "Junior Engineer", 65000, "2022-09-01"),
        (13, "Marco Bianchi", 3, 3, "Marketing Specialist", 60000, "2018-10-29"),
        (14, "Nora Jensen", 3, 3, "Content Writer", 54000, "2021-04-12"),
        (15, "Omar Farouk", 4, 4, "Support Agent", 45000, "2020-07-20"),
        (16, "Paula Gomez", 4, 4, "Support Agent", 46000, "2021-02-08"),
        (17, "Quentin Petit", 5, 5, "Accountant", 68000, "2017-12-04"),
        (18, "Rosa Costa", 1, 6, "Sales Associate", 50000, "2023-01-09"),
    ],
    "customers": [
        (1, "Acme Ltd", "London", "UK", "2019-01-15"),
        (2, "Blue Harbor", "Manchester", "UK", "2019-04-02"),
        (3, "Lumiere Bistro", "Paris", "France", "2019-06-20"),
        (4, "Nordwind GmbH", "Berlin", "Germany", "2019-09-11"),
        (5, "Sol y Mar", "Madrid", "Spain", "2020-01-08"),
        (6, "Trattoria Verde", "Rome", "Italy", "2020-02-14"),
        (7, "Alpine Gear", "Munich", "Germany", "2020-05-30"),
        (8, "Canal House", "Amsterdam", "Netherlands", "2020-07-07"),
        (9, "Atlas Books", "Lisbon", "Portugal", "2020-10-19"),
        (10, "Red Kite Studio", "London", "UK", "2021-01-25"),
        (11, "Le Petit Four", "Lyon", "France", "2021-03-03"),
        (12, "Barna Tech", "Barcelona", "Spain", "2021-05-17"),
        (13, "Milano Moda", "Milan", "Italy", "2021-08-09"),
        (14, "Thames Logistics", "London", "UK", "2021-11-22"),
        (15, "Rhein Werke", "Berlin", "Germany", "2022-02-01"),
        (16, "Iberia Foods", "Madrid", "Spain", "2022-04-26"),
        (17, "Seine Analytics", "Paris", "France", "2022-06-13"),
        (18, "Dutch Delight", "Amsterdam", "Netherlands", "2022-09-05"),
        (19, "Oporto Wines", "Porto", "Portugal", "2022-12-12"),
        (20, "Greenfield Farms", "Manchester", "UK", "2023-03-21"),
        (21, "Bavaria Outdoor", "Munich", "Germany", "2023-05-02"),
        (22, "Costa Brava Hotels", "Barcelona", "Spain", "2023-08-15"),
        (23, "Roma Antica", "Rome", "Italy", "2023-10-30"),
        (24, "Quiet Pine", "Lisbon", "Portugal", "2024-01-11"),
    ],
    "products": [
        (1, "Laptop Pro 14", "Electronics", 1400, 25),
        (2, "Laptop Air 13", "Electronics", 1100, 40),
        (3, "Wireless Mouse", "Accessories", 25, 300),
        (4, "Mechanical Keyboard", "Accessories", 90, 150),
        (5, "27-inch Monitor", "Electronics", 320, 60),
        (6, "USB-C Hub", "Accessories", 45, 220),
        (7, "Office Chair", "Furniture", 260, 35),
        (8, "Standing Desk", "Furniture", 540, 18),
        (9, "Desk Lamp", "Furniture", 38, 120),
        (10, "Noise-Cancelling Headphones", "Electronics", 280, 75),
        (11, "Webcam HD", "Electronics", 70, 0),
        (12, "Laser Printer", "Electronics", 230, 12),
        (13, "Printer Paper", "Supplies", 6, 1000),
        (14, "Notebook A5", "Supplies", 4, 800),
        (15, "Gel Pens", "Supplies", 9, 0),
        (16, "Bookshelf", "Furniture", 150, 0),
        (17, "Tablet 11", "Electronics", 650, 30),
        (18, "Phone Stand", "Accessories", 15, 0),
    ],
    "orders": [
        (1, 1, 6, "2022-01-05", "shipped"),
        (2, 2, 7, "2022-01-19", "shipped"),
        (3, 3, 6, "2022-02-03", "shipped"),
        (4, 1, 7, "2022-02-21", "shipped"),
        (5, 4, 8, "2022-03-08", "shipped"),
        (6, 5, 6, "2022-03-30", "cancelled"),
        (7, 6, 7, "2022-04-12", "shipped"),
        (8, 7, 1, "2022-05-02", "shipped"),
        (9, 8, 8, "2022-05-27", "shipped"),
        (10, 9, 6, "2022-06-15", "shipped"),
        (11, 10, 7, "2022-07-04", "shipped"),
        (12, 1, 6, "2022-07-29", "shipped"),
        (13, 11, 8, "2022-08-18", "cancelled"),
        (14, 12, 7, "2022-09-06", "shipped"),
        (15, 13, 6, "2022-09-27", "shipped"),
        (16, 4, 1, "2022-10-14", "shipped"),
        (17, 14, 7, "2022-11-02", "shipped"),
        (18, 15, 8, "2022-11-23", "shipped"),
        (19, 2, 6, "2022-12-09", "shipped"),
        (20, 16, 7, "2023-01-13", "shipped"),
        (21, 17, 18, "2023-02-01", "shipped"),
        (22, 3, 6, "2023-02-24", "shipped"),
        (23, 18, 7, "2023-03-15", "cancelled"),
        (24, 5, 18, "2023-04-04", "shipped"),
        (25, 19, 8, "2023-04-28", "shipped"),
        (26, 1, 7, "2023-05-19", "shipped"),
        (27, 7, 6, "2023-06-08", "shipped"),
        (28, 10, 18, "2023-07-01", "shipped"),
        (29, 12, 7, "2023-07-26", "shipped"),
        (30, 14, 6, "2023-08-17", "pending"),
        (31, 4, 7, "2023-09-05", "shipped"),
        (32, 21, 8, "2023-10-10", "pending"),
        (33, 6, 18, "2023-11-03", "shipped"),
        (34, 22, 6, "2023-12-01", "pending"),
        (35, 9, 7, "2024-01-16", "pending"),
        (36, 1, 18, "2024-02-07", "pending"),
    ],
    "order_items": [
        (1, 1, 2), (1, 3, 2),
        (2, 5, 3), (2, 4, 3),
        (3, 10, 1), (3, 9, 2),
        (4, 6, 5), (4, 3, 5),
        (5, 2, 4), (5, 5, 4), (5, 4, 4),
        (6, 8, 2),
        (7, 13, 20), (7, 14, 50),
        (8, 17, 3), (8, 6, 3),
        (9, 7, 6), (9, 8, 2),
        (10, 12, 1), (10, 13, 10),
        (11, 1, 1), (11, 10, 2), (11, 3, 1),
        (12, 15, 30), (12, 14, 40),
        (13, 7, 4),
        (14, 2, 10), (14, 6, 10),
        (15, 10, 3),
        (16, 5, 6), (16, 9, 6),
        (17, 13, 100), (17, 15, 20), (17, 14, 60),
        (18, 4, 8), (18, 3, 8),
        (19, 11, 5),
        (20, 1, 3), (20, 12, 1),
        (21, 17, 2), (21, 10, 2),
        (22, 7, 2),
        (23, 2, 1),
        (24, 8, 1), (24, 9, 1),
        (25, 13, 15),
        (26, 1, 1), (26, 5, 2),
        (27, 17, 4), (27, 6, 4),
        (28, 3, 10), (28, 4, 5),
        (29, 2, 6), (29, 11, 6),
        (30, 12, 2),
        (31, 10, 5), (31, 3, 5),
        (32, 7, 3), (32, 8, 3),
        (33, 13, 40), (33, 14, 40), (33, 15, 10),
        (34, 1, 5), (34, 17, 5),
        (35, 9, 4),
        (36, 2, 2), (36, 6, 2),
    ],
}

FINGERPRINT = hashlib.sha256(repr((SCHEMA_SQL, ROWS)).encode()).hexdigest()[:FINGERPRINT_CHARS]


def build_database(path: Path) -> Path:
    """Create the database at `path` (replacing any file there; foreign keys are checked while
    inserting) and return `path`."""
    path.unlink(missing_ok=True)
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA foreign_keys = ON")
        connection.executescript(SCHEMA_SQL)
        for table, rows in ROWS.items():
            placeholders = ", ".join("?" * len(rows[0]))
            connection.executemany(f"INSERT INTO {table} VALUES ({placeholders})", rows)
        connection.commit()
    return path


def database_path(folder: str | Path | None = None) -> Path:
    """The database file in `folder` (default $SMC_JAX_CACHE_DIR/tasks), built there when absent.

    It is built under a temporary name and renamed into place, so a reader never sees half a file.
    """
    folder = Path(folder) if folder is not None else cache_root() / CACHE_SUBFOLDER
    path = folder / f"{DATABASE_NAME}-{FINGERPRINT}.sqlite"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=folder, suffix=".sqlite.tmp")
        os.close(handle)
        temporary = Path(name)
        try:
            os.replace(build_database(temporary), path)
        finally:
            temporary.unlink(missing_ok=True)
    return path
