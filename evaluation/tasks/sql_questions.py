"""The text-to-SQL questions over the business database, with gold SQL (no trailing semicolon).

They range from selections and counts to grouping, joins (a self-join among them), ordering,
aggregates with HAVING and subqueries. Questions name the columns to return, and their order,
since execution accuracy compares whole rows. Gold queries with an ORDER BY order by keys without
ties on this data (tested), so an ordered comparison has one right answer. `DEMONSTRATION` is
prompt 2's solved example; it is not among the questions.
"""

from __future__ import annotations

from dataclasses import dataclass

from evaluation.tasks.base import Demonstration


@dataclass(frozen=True)
class SqlQuestion:
    """A natural-language question and the gold query that answers it."""

    id: str
    question: str
    gold_sql: str


DEMONSTRATION = Demonstration(input="How many products are there?", output="SELECT COUNT(*) FROM products")

QUESTIONS: tuple[SqlQuestion, ...] = (
    SqlQuestion("q01", "List the names of all departments located in London.",
                "SELECT name FROM departments WHERE location = 'London'"),
    SqlQuestion("q02", "What are the names of the customers based in Germany?",
                "SELECT name FROM customers WHERE country = 'Germany'"),
    SqlQuestion("q03", "What are the names of the products with a unit price above 500?",
                "SELECT name FROM products WHERE unit_price > 500"),
    SqlQuestion("q04", "List the names of the products that are out of stock.",
                "SELECT name FROM products WHERE units_in_stock = 0"),
    SqlQuestion("q05", "Give the names of the employees hired before 2016.",
                "SELECT name FROM employees WHERE hire_date < '2016-01-01'"),
    SqlQuestion("q06", "What are the title and the salary of Ines Duarte?",
                "SELECT title, salary FROM employees WHERE name = 'Ines Duarte'"),
    SqlQuestion("q07", "How many orders are pending?",
                "SELECT COUNT(*) FROM orders WHERE status = 'pending'"),
    SqlQuestion("q08", "How many employees work in the Engineering department?",
                "SELECT COUNT(*) FROM employees AS e JOIN departments AS d ON e.department_id = d.department_id "
                "WHERE d.name = 'Engineering'"),
    SqlQuestion("q09", "How many different countries are our customers from?",
                "SELECT COUNT(DISTINCT country) FROM customers"),
    SqlQuestion("q10", "How many customers signed up in 2021?",
                "SELECT COUNT(*) FROM customers WHERE signup_date BETWEEN '2021-01-01' AND '2021-12-31'"),
    SqlQuestion("q11", "What is the highest salary of any employee?",
                "SELECT MAX(salary) FROM employees"),
    SqlQuestion("q12", "What is the average salary of the employees of the Support department?",
                "SELECT AVG(e.salary) FROM employees AS e JOIN departments AS d ON e.department_id = d.department_id "
                "WHERE d.name = 'Support'"),
    SqlQuestion("q13", "How many units are in stock across all products?",
                "SELECT SUM(units_in_stock) FROM products"),
    SqlQuestion("q14", "List the names of the three most expensive products, most expensive first.",
                "SELECT name FROM products ORDER BY unit_price DESC LIMIT 3"),
    SqlQuestion("q15", "List the name and salary of every employee, from the highest salary to the lowest.",
                "SELECT name, salary FROM employees ORDER BY salary DESC"),
    SqlQuestion("q16", "What is the name of the customer who signed up most recently?",
                "SELECT name FROM customers ORDER BY signup_date DESC LIMIT 1"),
    SqlQuestion("q17", "List the names of the customers from the UK in alphabetical order.",
                "SELECT name FROM customers WHERE country = 'UK' ORDER BY name"),
    SqlQuestion("q18", "For each product category, give the category and its number of products.",
                "SELECT category, COUNT(*) FROM products GROUP BY category"),
    SqlQuestion("q19", "For each order status, give the status and the number of orders with it.",
                "SELECT status, COUNT(*) FROM orders GROUP BY status"),
    SqlQuestion("q20", "For each country, give the country and its number of customers.",
                "SELECT country, COUNT(*) FROM customers GROUP BY country"),
    SqlQuestion("q21", "Give the names of the customers with an order handled by Greta Lindqvist, each name once.",
                "SELECT DISTINCT c.name FROM customers AS c JOIN orders AS o ON c.customer_id = o.customer_id "
                "JOIN employees AS e ON o.employee_id = e.employee_id WHERE e.name = 'Greta Lindqvist'"),
    SqlQuestion("q22", "What is the name of the department Kaito Sato works in?",
                "SELECT d.name FROM employees AS e JOIN departments AS d ON e.department_id = d.department_id "
                "WHERE e.name = 'Kaito Sato'"),
    SqlQuestion("q23", "List every employee who has a manager: the employee's name, then the manager's name.",
                "SELECT e.name, m.name FROM employees AS e JOIN employees AS m ON e.manager_id = m.employee_id"),
    SqlQuestion("q24", "What are the names of the products in order 11?",
                "SELECT p.name FROM order_items AS i JOIN products AS p ON i.product_id = p.product_id "
                "WHERE i.order_id = 11"),
    SqlQuestion("q25", "Give the names of the customers who placed more than two orders.",
                "SELECT c.name FROM customers AS c JOIN orders AS o ON c.customer_id = o.customer_id "
                "GROUP BY c.customer_id HAVING COUNT(*) > 2"),
    SqlQuestion("q26", "Which departments have an average salary above 80000? Give their names.",
                "SELECT d.name FROM departments AS d JOIN employees AS e ON d.department_id = e.department_id "
                "GROUP BY d.department_id HAVING AVG(e.salary) > 80000"),
    SqlQuestion("q27", "Which product categories have more than 500 units in stock in total? Give the categories.",
                "SELECT category FROM products GROUP BY category HAVING SUM(units_in_stock) > 500"),
    SqlQuestion("q28", "Give the names of the employees who earn more than the average salary of all employees.",
                "SELECT name FROM employees WHERE salary > (SELECT AVG(salary) FROM employees)"),
    SqlQuestion("q29", "List the names of the customers who have never placed an order.",
                "SELECT name FROM customers WHERE customer_id NOT IN (SELECT customer_id FROM orders)"),
    SqlQuestion("q30", "List the names of the products that have never been ordered.",
                "SELECT name FROM products WHERE product_id NOT IN (SELECT product_id FROM order_items)"),
    SqlQuestion("q31", "What is the name of the cheapest product in the Electronics category?",
                "SELECT name FROM products WHERE category = 'Electronics' AND unit_price = "
                "(SELECT MIN(unit_price) FROM products WHERE category = 'Electronics')"),
    SqlQuestion("q32", "What is the total revenue (quantity times unit price) of all shipped orders?",
                "SELECT SUM(i.quantity * p.unit_price) FROM orders AS o "
                "JOIN order_items AS i ON o.order_id = i.order_id "
                "JOIN products AS p ON i.product_id = p.product_id WHERE o.status = 'shipped'"),
    SqlQuestion("q33", "For each customer with shipped orders, give the customer's name and the total amount "
                       "(quantity times unit price) of their shipped orders, from the largest total to the smallest.",
                "SELECT c.name, SUM(i.quantity * p.unit_price) AS total FROM customers AS c "
                "JOIN orders AS o ON c.customer_id = o.customer_id JOIN order_items AS i ON o.order_id = i.order_id "
                "JOIN products AS p ON i.product_id = p.product_id WHERE o.status = 'shipped' "
                "GROUP BY c.customer_id ORDER BY total DESC"),
    SqlQuestion("q34", "What is the name of the employee who handled the most orders?",
                "SELECT e.name FROM employees AS e JOIN orders AS o ON e.employee_id = o.employee_id "
                "GROUP BY e.employee_id ORDER BY COUNT(*) DESC LIMIT 1"),
    SqlQuestion("q35", "For each product that was ordered, give the product name and the total quantity ordered.",
                "SELECT p.name, SUM(i.quantity) FROM products AS p "
                "JOIN order_items AS i ON p.product_id = i.product_id GROUP BY p.product_id"),
    SqlQuestion("q36", "Which department has the largest budget? Give its name and budget.",
                "SELECT name, budget FROM departments ORDER BY budget DESC LIMIT 1"),
    SqlQuestion("q37", "List the names of the departments that have no employees.",
                "SELECT name FROM departments WHERE department_id NOT IN (SELECT department_id FROM employees)"),
    SqlQuestion("q38", "For every department, give its name and its number of employees, including departments "
                       "without employees.",
                "SELECT d.name, COUNT(e.employee_id) FROM departments AS d "
                "LEFT JOIN employees AS e ON d.department_id = e.department_id GROUP BY d.department_id"),
    SqlQuestion("q39", "What is the name of the lowest-paid employee of the Sales department?",
                "SELECT e.name FROM employees AS e JOIN departments AS d ON e.department_id = d.department_id "
                "WHERE d.name = 'Sales' ORDER BY e.salary LIMIT 1"),
    SqlQuestion("q40", "Give the names of the customers who ordered a Furniture product, each name once, "
                       "in alphabetical order.",
                "SELECT DISTINCT c.name FROM customers AS c JOIN orders AS o ON c.customer_id = o.customer_id "
                "JOIN order_items AS i ON o.order_id = i.order_id JOIN products AS p ON i.product_id = p.product_id "
                "WHERE p.category = 'Furniture' ORDER BY c.name"),
)
