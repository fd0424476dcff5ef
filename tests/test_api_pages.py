"""Offline /docs, HTML 404 pages for the dashboard, and POST /sweeps on a dirty checkout."""

from __future__ import annotations

from pathlib import Path

from service_fixtures import AUTH, make_counting_target
from test_api import _client


def test_docs_are_served_without_a_cdn(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert "cdn" not in page.text.lower() and "/docs-static/swagger-ui-bundle.js" in page.text
        js = client.get("/docs-static/swagger-ui-bundle.js")
        assert js.status_code == 200 and len(js.content) > 100_000
        assert client.get("/docs-static/swagger-ui.css").status_code == 200


def test_a_missing_dashboard_page_is_a_page_and_the_api_keeps_json(tmp_path: Path) -> None:
    html = {"accept": "text/html,application/xhtml+xml"}
    with _client(tmp_path, auth=False) as client:
        page = client.get("/ui/sweeps/nope", headers=html)
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "nope" in page.text and "href='/'" in page.text
        api = client.get("/sweeps/nope", headers=html)
        assert api.status_code == 404 and api.json()["detail"]["code"] == "not_found"


def test_post_sweeps_refuses_a_dirty_checkout_unless_allowed(tmp_path: Path) -> None:
    target = make_counting_target(tmp_path / "target")
    (target / "train.py").write_text((target / "train.py").read_text() + "# edited\n")
    body = {"name": "d1", "target": str(target), "budget_s": 1, "proposer": "queue"}
    with _client(tmp_path) as client:
        r = client.post("/sweeps", json=body, headers=AUTH)
        assert r.status_code == 422 and "train.py" in r.json()["detail"]["message"]
        assert "git -C" in r.json()["detail"]["message"]
        assert client.get("/sweeps", headers=AUTH).json()["count"] == 0
        r = client.post("/sweeps", json={**body, "allow_dirty": True}, headers=AUTH)
        assert r.status_code == 201, r.text
