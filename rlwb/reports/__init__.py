"""Reports for people, one module per job: `figures` (regenerate a run's figures from data/), `drift` (compare
runs: `compare`, `rerun`'s verdict), `rerun` (which run a rerun starts from), `index` (outputs/index.html),
`export` (report.html), `times` (wall time per phase), `pages` (the HTML templates)."""
