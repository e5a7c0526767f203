#!/usr/bin/python3
"""The explorer page in a real browser (Debian's chromium + chromium-driver + python3-selenium).

Run by tests/tests/e2e/explorer.rs against a live `ember run` that samples two fixtures in two
cgroups. Loads the page, picks a range, filters a container, searches a function, opens a
differential graph; asserts on the DOM and saves a screenshot of each step under --out.
Prints "browser checks passed" at the end; any failed check raises.
"""
import argparse
import re
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

A_FUNCS = ("hot_a", "hot_b")
B_FUNCS = ("sort_round", "copy_round", "hash_round", "cmp_items")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", default="", help="the agent's token: log in as its printed address does")
    ap.add_argument("--container-id", required=True)
    ap.add_argument("--other-container-id", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    driver.set_page_load_timeout(60)
    wait = WebDriverWait(driver, 60)
    step = [0]

    def shot(name):
        step[0] += 1
        path = f"{args.out}/{step[0]:02d}-{name}.png"
        driver.save_screenshot(path)
        print("screenshot", path)

    def status():
        return driver.find_element(By.ID, "status").text

    def loaded(previous=None):
        # The status line names the stack count once a graph is drawn.
        try:
            wait.until(lambda d: "distinct stacks" in status() and status() != previous)
        except Exception:
            shot("timeout")
            raise AssertionError(f"no new graph: status {status()!r}, before {previous!r}")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chart g.frame"))
        time.sleep(0.8)  # let d3's transitions settle before reading widths and colours

    def frame_names():
        return {g.get_attribute("name") for g in driver.find_elements(By.CSS_SELECTOR, "#chart g.frame")}

    def check(cond, what):
        if not cond:
            shot("failed")
            raise AssertionError(what)
        print("ok:", what)

    try:
        # 0. Log in the way a newcomer does: one click on the address ember printed; the
        # cookie is set and the token leaves the address bar.
        if args.token:
            driver.get(args.url + "?token=" + args.token)
            check(args.token not in driver.current_url, f"the token left the address: {driver.current_url}")
        # 1. Load: the last 15 minutes, everything.
        driver.get(args.url)
        loaded()
        names = frame_names()
        check(any(f in names for f in A_FUNCS) and any(f in names for f in B_FUNCS),
              "unfiltered graph shows both fixtures' functions")
        check("all" in names, "the root frame is there")
        rows = driver.find_elements(By.CSS_SELECTOR, "#top tbody tr")
        check(len(rows) > 3, "top-functions table has rows")
        pct = rows[0].find_elements(By.TAG_NAME, "td")[2].text
        check(re.fullmatch(r"\d+\.\d\d%", pct) is not None, f"flat percentage shown ({pct})")
        shot("loaded")

        # 2. Pick a range: the 5-minute preset, then a brush over the timeline.
        before = status()
        driver.find_element(By.CSS_SELECTOR, '#presets button[data-range="5m"]').click()
        loaded(before)
        check("5m" in driver.find_element(By.CSS_SELECTOR, "#presets button.on").text, "5m preset is on")
        # A preset's selection spans the whole timeline, so a drag that starts inside it
        # only moves it (clamped: nothing changes); narrow it by its west handle instead.
        w = driver.find_element(By.ID, "timeline").size["width"]
        handle = driver.find_element(By.CSS_SELECTOR, "#timeline .handle--w")
        before = status()
        webdriver.ActionChains(driver).move_to_element(handle).click_and_hold() \
            .move_by_offset(int(w * 0.4), 0).release().perform()
        loaded(before)
        check("from=" in driver.current_url, "range is in the URL")
        shot("range")
        driver.find_element(By.CSS_SELECTOR, '#presets button[data-range="15m"]').click()
        loaded(before)

        # 3. Filter a container.
        wait.until(lambda d: d.find_elements(By.ID, "filter-container_id"))
        before = status()
        Select(driver.find_element(By.ID, "filter-container_id")).select_by_value(args.container_id)
        loaded(before)
        names = frame_names()
        check(any(f in names for f in A_FUNCS), "filtered graph shows the container's functions")
        check(not any(f in names for f in B_FUNCS), "filtered graph hides the other container")
        check(f"container_id={args.container_id}" in driver.current_url, "filter is in the URL")
        shot("filtered")

        # 4. Search a function.
        box = driver.find_element(By.ID, "search")
        box.send_keys("hot_a")
        wait.until(lambda d: "search:" in d.find_element(By.ID, "details").text)
        details = driver.find_element(By.ID, "details").text
        m = re.search(r"\(\s*([\d.]+)%\)", details)
        check(m is not None and 0 < float(m.group(1)) <= 100, f"search reports a share ({details})")
        highlighted = [g for g in driver.find_elements(By.CSS_SELECTOR, "#chart g.frame")
                       if g.find_element(By.TAG_NAME, "rect").get_attribute("fill").lower() == "#e600e6"]
        check(any(g.get_attribute("name") == "hot_a" for g in highlighted), "hot_a frames highlighted")
        shot("search")
        box.clear()
        box.send_keys(" ")
        box.clear()
        driver.execute_script("document.getElementById('search').dispatchEvent(new Event('input'))")

        # 5. Zoom: click a frame, it fills the width.
        target = next(g for g in driver.find_elements(By.CSS_SELECTOR, "#chart g.frame")
                      if g.get_attribute("name") in A_FUNCS)
        driver.execute_script(
            "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", target)
        time.sleep(1.2)
        zoomed = [g for g in driver.find_elements(By.CSS_SELECTOR, "#chart g.frame")
                  if g.get_attribute("name") == target.get_attribute("name")]
        chart_w = driver.find_element(By.CSS_SELECTOR, "#chart svg").size["width"]
        widest = max(float(g.find_element(By.TAG_NAME, "rect").get_attribute("width") or 0) for g in zoomed)
        check(widest > 0.9 * chart_w, f"zoomed frame spans the chart ({widest:.0f} of {chart_w})")
        shot("zoomed")
        driver.find_element(By.ID, "reset").click()

        # 6. Icicle: the same graph upside down (the status line stays the same).
        # One script call: the chart is redrawn under the test, and element handles taken
        # across a redraw go stale.
        def root_on_top(d):
            return d.execute_script(
                "return [...document.querySelectorAll('#chart g.frame')].some(g =>"
                " g.getAttribute('name') === 'all' &&"
                " (g.getAttribute('transform') || '').replace(/ /g, '').includes('translate(0,0)'))")
        driver.find_element(By.ID, "icicle").click()
        try:
            wait.until(root_on_top)
        except Exception:
            pass
        time.sleep(0.8)
        check(root_on_top(driver), "icicle puts the root on top")
        shot("icicle")
        driver.find_element(By.ID, "icicle").click()
        wait.until(lambda d: not root_on_top(d))
        time.sleep(0.8)

        # 7. Differential: this container against the other one, same range.
        Select(driver.find_element(By.ID, "baseline")).select_by_value("filter")
        wait.until(lambda d: d.find_elements(By.ID, "base-container_id"))
        Select(driver.find_element(By.ID, "base-container_id")).select_by_value(args.other_container_id)
        before = status()
        driver.find_element(By.ID, "diff").click()
        loaded(before)
        check("differential" in status(), "status names the differential")
        red = blue = 0
        for g in driver.find_elements(By.CSS_SELECTOR, "#chart g.frame"):
            fill = g.find_element(By.TAG_NAME, "rect").get_attribute("fill")
            m = re.match(r"rgb\((\d+),\s*(\d+),\s*(\d+)\)", fill or "")
            if not m:
                continue
            r, gg, b = map(int, m.groups())
            if r > b + 20 and g.get_attribute("name") in A_FUNCS:
                red += 1
            if b > r + 20:
                blue += 1
        check(red > 0, f"functions only in this container are red (grew): {red}")
        check(blue > 0, f"functions only in the baseline are blue (shrank): {blue}")
        shot("diff")

        # 8. The USE page answers and links back to profiles.
        driver.get(args.url + "use")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#use tbody tr"))
        wait.until(lambda d: "rates over" in d.find_element(By.ID, "status").text)
        rows = driver.find_elements(By.CSS_SELECTOR, "#use tbody tr")
        cells = [r.find_elements(By.TAG_NAME, "td") for r in rows]
        check(any(c[0].text == "host" and c[1].text == "CPU" for c in cells), "USE page has the host CPU row")
        check(any(args.container_id[:12] in c[0].text or args.container_id in c[0].text for c in cells),
              "USE page has the test container")
        coloured = [td for c in cells for td in c if td.get_attribute("class") in ("ok", "warn", "bad")]
        check(len(coloured) > 3, "USE cells are coloured against thresholds")
        link = driver.find_element(By.CSS_SELECTOR, "#use a.profile-cpu").get_attribute("href")
        check("type=cpu" in link and "from=" in link, "USE rows link to profiles")
        shot("use")
    finally:
        driver.quit()
    print("browser checks passed")


if __name__ == "__main__":
    sys.exit(main())
