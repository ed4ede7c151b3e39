// Live updates without a page reload: every 1.5 s, fetch this page's <main> again
// and swap it in when the server's version of it changed. Skipped while a person
// is typing in a form, so an answer being written is never wiped out.
(function () {
  "use strict";
  var main = document.querySelector("main[data-version]");
  if (!main) { return; }
  function busy() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
  }
  function poll() {
    if (busy()) { return; }
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    url.searchParams.delete("token");
    url.searchParams.delete("saved");  // a confirmation is shown once, not on every update
    fetch(url.toString(), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null || busy()) { return; }
        var holder = document.createElement("div");
        holder.innerHTML = text;  // the server's own escaped HTML, never model text raw
        var fresh = holder.querySelector("main[data-version]");
        if (fresh && fresh.getAttribute("data-version") !== main.getAttribute("data-version")) {
          main.replaceWith(fresh);
          main = fresh;
        }
      })
      .catch(function () { /* the console stopped; keep the last page */ });
  }
  window.setInterval(poll, 1500);
})();
