use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph};

pub fn render(frame: &mut Frame, area: Rect) {
    let lines = vec![
        Line::from("q, Esc, Ctrl-C   quit (Esc leaves a detail view first)"),
        Line::from("↑ ↓  (k j)       select a node"),
        Line::from("Enter            the selected node's detail: every counter,"),
        Line::from("                 errors by kind, per-interface network"),
        Line::from("p, space         pause / resume updates"),
        Line::from("+ / -            poll slower / faster: 100 ms, 250 ms, 500 ms,"),
        Line::from("                 1 s, 2 s, 5 s, 10 s"),
        Line::from("w                chart window: 60 s or 5 min"),
        Line::from("? h              this help"),
        Line::from(""),
        Line::from("Rates are computed from each node's totals between two polls;"),
        Line::from("a restarted node shows a reset, not a negative spike. CPU % is"),
        Line::from("of one core; NET is kvd's own sockets, NIC the host interfaces."),
        Line::from("A node that stops answering turns red and is retried with"),
        Line::from("backoff until it returns."),
    ];
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" help ")),
        area,
    );
}
