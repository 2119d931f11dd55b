"""/docs in a real headless Chromium that cannot reach anything but the test server.

Every request that is not to the loopback server goes to a local proxy that records it and
answers nothing (so nothing leaves the machine), and the page's network log is read back: the
page must load, list every operation and run "Try it out" on /embed with no request leaving
127.0.0.1.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TEXT = "swagger ui without internet"
WAIT = 60


class SinkProxy:
    """A local HTTP proxy that records the first line of every request and answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                except OSError:
                    first = "<unreadable>"
                if first:
                    self.requests.append(first)

    def from_the_page(self) -> list[str]:
        """What reached the sink, less Chromium's own calls home (updates, sign-in), which
        headless Chromium makes whatever the flags; they are blocked here like the rest."""
        return [r for r in self.requests if not _BROWSER_SERVICE.search(r)]

    def close(self) -> None:
        self.sock.close()


_BROWSER_SERVICE = re.compile(
    r"^\S+ (https?://)?[a-z0-9.-]+\.(google\.com|googleapis\.com|gvt1\.com|gvt2\.com)[:/]"
)


@pytest.fixture(scope="module")
def proxy() -> Iterator[SinkProxy]:
    sink = SinkProxy()
    yield sink
    sink.close()


@pytest.fixture(scope="module")
def browser(proxy: SinkProxy) -> Iterator[WebDriver]:
    for tool in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(tool), f"{tool} missing: `make test` installs chromium and its driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2000",
        # Everything but loopback (which Chromium never proxies) goes to the sink, and names
        # never resolve, so not even a DNS query leaves.
        f"--proxy-server=http://127.0.0.1:{proxy.port}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver: WebDriver) -> list[str]:
    """Every URL the page asked for since the last call, from Chromium's network log."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def off_server(urls: list[str], server: LiveServer) -> list[str]:
    local = urlsplit(server.url).netloc
    return [
        u
        for u in urls
        if urlsplit(u).scheme not in ("data", "blob") and urlsplit(u).netloc != local
    ]


def wait_for(driver: WebDriver, css: str, root: WebElement | None = None) -> WebElement:
    scope = root or driver
    WebDriverWait(driver, WAIT).until(lambda _: scope.find_elements(By.CSS_SELECTOR, css))
    return scope.find_elements(By.CSS_SELECTOR, css)[0]


def operation(driver: WebDriver, method: str, path: str) -> WebElement:
    for block in driver.find_elements(By.CSS_SELECTOR, f".opblock-{method}"):
        found = block.find_elements(By.CSS_SELECTOR, f'.opblock-summary-path[data-path="{path}"]')
        if found:
            return block
    raise AssertionError(f"{method.upper()} {path} is not on the page")


def listed_operations(driver: WebDriver) -> set[tuple[str, str]]:
    wait_for(driver, ".opblock")
    listed = set()
    for block in driver.find_elements(By.CSS_SELECTOR, ".opblock"):
        method = block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.lower()
        path = block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute(
            "data-path"
        )
        listed.add((method, str(path)))
    return listed


def documented_operations(
    server: LiveServer, headers: dict[str, str] | None = None
) -> set[tuple[str, str]]:
    doc = httpx.get(f"{server.url}/api-doc/openapi.json", headers=headers, timeout=30).json()
    return {(method, path) for path, ops in doc["paths"].items() for method in ops}


def test_docs_list_every_operation_and_try_it_out_embeds(
    browser: WebDriver, proxy: SinkProxy, embedding_server: LiveServer
) -> None:
    browser.get(f"{embedding_server.url}/docs")
    listed = listed_operations(browser)
    documented = documented_operations(embedding_server)
    assert len(documented) >= 15
    assert listed == documented

    block = operation(browser, "post", "/embed")
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait_for(browser, ".try-out__btn", block).click()
    body = wait_for(browser, "textarea.body-param__text", block)
    body.clear()
    body.send_keys(json.dumps({"inputs": TEXT}))
    wait_for(browser, ".execute", block).click()
    status = wait_for(browser, ".live-responses-table tr.response .response-col_status", block)
    assert status.text.strip().startswith("200"), status.text
    shown = wait_for(
        browser, ".live-responses-table tr.response .response-col_description pre", block
    )
    vectors = json.loads(shown.text)
    expected = httpx.post(f"{embedding_server.url}/embed", json={"inputs": TEXT}, timeout=30)
    assert len(vectors) == 1 and len(vectors[0]) == len(expected.json()[0])
    assert vectors[0] == pytest.approx(expected.json()[0], abs=1e-6)

    urls = requested_urls(browser)
    assert any(u.endswith("/docs/assets/swagger-ui-bundle.js") for u in urls), urls
    assert any(u.endswith("/embed") for u in urls), urls
    assert off_server(urls, embedding_server) == []
    assert proxy.from_the_page() == []


def test_the_blocking_and_the_check_catch_a_request_that_leaves(
    browser: WebDriver, proxy: SinkProxy, embedding_server: LiveServer
) -> None:
    """A page asking a CDN for Swagger UI, as FastAPI's stock /docs does, is caught twice."""
    browser.get(f"{embedding_server.url}/docs")
    wait_for(browser, ".opblock")
    requested_urls(browser)
    external = "http://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css"
    browser.execute_script(
        "const l = document.createElement('link'); l.rel = 'stylesheet';"
        "l.href = arguments[0]; document.head.appendChild(l);",
        external,
    )
    WebDriverWait(browser, WAIT).until(lambda _: proxy.from_the_page())
    assert proxy.from_the_page() == [f"GET {external} HTTP/1.1"]
    assert off_server(requested_urls(browser), embedding_server) == [external]
    proxy.requests.clear()


def test_docs_stay_open_with_an_api_key(
    browser: WebDriver, proxy: SinkProxy, embedding_folder: Path
) -> None:
    key = "docs-key-31f4"
    with LiveServer(Settings.single(str(embedding_folder), api_key=key)) as srv:
        requested_urls(browser)
        browser.get(f"{srv.url}/docs")
        listed = listed_operations(browser)
        assert listed == documented_operations(srv)
        assert ("post", "/embed") in listed
        # The page is open; the inference routes still want the key.
        assert httpx.post(f"{srv.url}/embed", json={"inputs": TEXT}, timeout=30).status_code == 401
        assert off_server(requested_urls(browser), srv) == []
    assert proxy.from_the_page() == []
