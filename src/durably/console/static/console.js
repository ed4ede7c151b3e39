// Live updates without a page reload: every 1.5 s, ask the server for this page's
// change stamp (a few bytes), and only when it differs from the version shown fetch
// the page again and swap its <main> in. Skipped while a person is typing in a form,
// so an answer being written is never wiped out. The address carries the console's
// token (/t/<token>/...), so the same address is asked, with ?stamp=1.
(function () {
  "use strict";
  var main = document.querySelector("main[data-version]");
  if (!main) { return; }
  var asking = false;
  function busy() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
  }
  function address(stamp) {
    var url = new URL(window.location.href);
    url.hash = "";
    url.searchParams.delete("saved");  // a confirmation is shown once, not on every update
    if (stamp) { url.searchParams.set("stamp", "1"); }
    return url.toString();
  }
  function text(response) { return response.ok ? response.text() : null; }
  function swap(page) {
    if (page === null || busy()) { return; }
    var holder = document.createElement("div");
    holder.innerHTML = page;  // the server's own escaped HTML, never model text raw
    var fresh = holder.querySelector("main[data-version]");
    if (fresh && fresh.getAttribute("data-version") !== main.getAttribute("data-version")) {
      main.replaceWith(fresh);
      main = fresh;
    }
  }
  function poll() {
    if (asking || busy()) { return; }
    asking = true;  // one question at a time: a slow answer is not asked again meanwhile
    fetch(address(true), { credentials: "omit", cache: "no-store" })
      .then(text)
      .then(function (stamp) {
        if (stamp === null || stamp === main.getAttribute("data-version") || busy()) { return null; }
        return fetch(address(false), { credentials: "omit", cache: "no-store" })
          .then(text)
          .then(swap);
      })
      .catch(function () { /* the console stopped; keep the last page */ })
      .then(function () { asking = false; });
  }
  window.setInterval(poll, 1500);
})();
