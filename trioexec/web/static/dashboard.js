// trioexec dashboard: live updates. The pages work without this file (forms post,
// pages render); with it, one Server-Sent Events stream (/events) says when the
// store changed, the counts are updated in place, and each live part of the page
// (an element with data-fragment="NAME") is re-fetched as ?fragment=NAME.
(function () {
  "use strict";
  if (!window.EventSource || !window.fetch) {
    return;
  }
  var body = document.body;
  var version = body.getAttribute("data-version");
  var live = document.getElementById("live");
  var busy = false;
  var again = false;

  function show(state, text) {
    if (live) {
      live.setAttribute("data-state", state);
      live.textContent = text;
    }
  }

  // A part the person is working in (typing a promise's value) is left alone.
  function inUse(el) {
    var active = document.activeElement;
    if (active && active !== body && el.contains(active)) {
      return true;
    }
    var fields = el.querySelectorAll("textarea, input[type=text], input:not([type])");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) {
        return true;
      }
    }
    return false;
  }

  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    var parts = Array.prototype.slice.call(document.querySelectorAll("[data-fragment]"));
    busy = true;
    var pending = parts.map(function (el) {
      if (inUse(el)) {
        return Promise.resolve();
      }
      var url = new URL(window.location.href);
      url.searchParams.set("fragment", el.getAttribute("data-fragment"));
      return fetch(url.toString(), { credentials: "same-origin" })
        .then(function (response) {
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          if (html !== null && !inUse(el)) {
            el.innerHTML = html;
          }
        })
        .catch(function () {});
    });
    Promise.all(pending).then(function () {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    });
  }

  var source = new EventSource("/events");
  source.addEventListener("open", function () {
    show("on", "live");
  });
  source.addEventListener("error", function () {
    show("off", "live updates reconnecting…");
  });
  source.addEventListener("refresh", function (event) {
    var data = JSON.parse(event.data);
    Object.keys(data.counts).forEach(function (what) {
      var cells = document.querySelectorAll('[data-count="' + what + '"]');
      for (var i = 0; i < cells.length; i++) {
        cells[i].textContent = String(data.counts[what]);
      }
    });
    if (String(data.version) !== version) {
      version = String(data.version);
      body.setAttribute("data-version", version);
      refresh();
    }
  });
})();
