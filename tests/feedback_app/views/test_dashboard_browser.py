"""The dashboard pages on a laptop screen and on a phone, in real Chromium: nothing wider than the screen except
inside the boxes meant to scroll (wide tables, the lineage graph, a chart on a phone), and charts scale to the width
without shrinking below a readable size."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.feedback_app.views.test_dashboard import labelled, registry  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

SCREENS = {"laptop": (1366, 768), "phone": (390, 844)}
SCREENSHOTS = {
    ("project-dashboard", "laptop"): "dashboard.png",
    ("project-models", "laptop"): "models.png",
    ("project-leaderboard", "laptop"): "leaderboard.png",
    ("project-dashboard", "phone"): "dashboard-phone.png",
}


@pytest.mark.parametrize("screen", SCREENS)
@pytest.mark.parametrize("page_name", ["project-dashboard", "project-models", "project-leaderboard"])
def test_dashboard_pages_fit_the_screen(browser_page_for, researcher, project, labelled, docs_dir, page_name, screen):  # noqa: F811
    width, height = SCREENS[screen]
    page = browser_page_for(researcher, width=width, height=height)
    page.goto(reverse(page_name, args=[project.pk]))
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    for chart in page.query_selector_all("svg.chart"):
        bounds = chart.bounding_box()
        assert bounds["width"] >= min(width - 80, 500) and bounds["height"] > 50  # readable, not squeezed
        assert chart.evaluate("e => e.closest('.chart-box').getBoundingClientRect().width") <= width
    if page_name == "project-models":
        graph = page.query_selector("svg.lineage").bounding_box()
        assert graph["height"] > 50
    if (page_name, screen) in SCREENSHOTS:
        page.screenshot(path=docs_dir / SCREENSHOTS[page_name, screen], full_page=True)
