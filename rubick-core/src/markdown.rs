//! Markdown tables: the one writer of every table the tools print as Markdown (the
//! profile comparison, the simulation summaries side by side, the memory estimate's
//! agreement with the reference facts).

use std::fmt;

/// A Markdown table: its header, the `|---|` rule under it, then one line per row.
/// A `|` inside a cell is escaped (`\|`) so that it cannot split the cell.
#[derive(Debug, Clone)]
pub struct Table {
    text: String,
}

impl Table {
    /// A table with these column headers and no rows yet.
    pub fn new(header: &[&str]) -> Self {
        let mut table = Table { text: String::new() };
        table.row(header);
        table.text.push('|');
        table.text.push_str(&"---|".repeat(header.len()));
        table.text.push('\n');
        table
    }

    /// Appends a row, one cell per column.
    pub fn row<S: AsRef<str>>(&mut self, cells: &[S]) {
        self.text.push('|');
        for cell in cells {
            self.text.push(' ');
            self.text.push_str(&cell.as_ref().replace('|', "\\|"));
            self.text.push_str(" |");
        }
        self.text.push('\n');
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_its_rule_under_the_header_and_escapes_bars() {
        let mut t = Table::new(&["a", "b"]);
        t.row(&["1", "x|y"]);
        t.row(&[String::new(), "2".to_owned()]);
        assert_eq!(t.to_string(), "| a | b |\n|---|---|\n| 1 | x\\|y |\n|  | 2 |\n");
    }
}
