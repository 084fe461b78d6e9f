// durable-etl console: live refresh. Pages work without this script; with it, a page whose
// <main> carries data-refresh="N" fetches itself every N seconds and swaps in the new <main>
// (the page it came back with says whether to go on: a job page stops once the job has ended).
// It waits while the tab is hidden, while the reader has focus on a form field or on anything in
// <main> (a keyboard user on a link keeps their place), and while text is selected. It stops when
// the session has ended (the fetch is redirected to sign-in) or the page answers an error; a
// reload starts it again. Served from this origin only, as the Content-Security-Policy
// requires; no inline script, no other origin.
"use strict";

(function () {
  function due() {
    var main = document.querySelector("main[data-refresh]");
    var seconds = main ? Number(main.getAttribute("data-refresh")) : 0;
    return seconds > 0 ? seconds * 1000 : 0;
  }

  function busy() {
    var active = document.activeElement;
    var main = document.querySelector("main");
    var focused = active && active !== document.body &&
      ((main && main.contains(active)) || active.closest("form") !== null);
    var selected = String(window.getSelection ? window.getSelection() : "") !== "";
    return document.hidden || focused || selected;
  }

  function schedule() {
    var wait = due();
    if (wait > 0) {
      window.setTimeout(refresh, wait);
    }
  }

  function refresh() {
    if (busy()) {
      schedule();
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok || response.redirected) {
          return null;
        }
        return response.text();
      })
      .then(function (text) {
        if (text === null) {
          return;
        }
        var fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main");
        var current = document.querySelector("main");
        if (fresh && current && !busy()) {
          current.replaceWith(document.adoptNode(fresh));
        }
        schedule();
      })
      .catch(schedule);
  }

  schedule();
})();
