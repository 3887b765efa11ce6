// Keyboard shortcuts and small comforts for the dashboard's lists.
//
// A same-origin file (the CSP allows scripts from 'self' and with the page's
// nonce only), so no inline handlers anywhere: everything is delegated from
// the document. Pages work without it; it only adds shortcuts and keeps the
// user's place when the list refreshes itself.
(function () {
  "use strict";

  var selectedId = null;
  var checkedIds = [];
  var focusWasInResults = false;

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("#results tbody tr[data-attempt]"));
  }

  function current() {
    if (!selectedId) return null;
    return document.querySelector('#results tr[data-attempt="' + selectedId + '"]');
  }

  function mark(row) {
    rows().forEach(function (r) { r.classList.remove("selected"); });
    if (row) row.classList.add("selected");
  }

  function select(row, focus) {
    selectedId = row ? row.getAttribute("data-attempt") : null;
    mark(row);
    if (row && focus) {
      row.focus();
      row.scrollIntoView({ block: "nearest" });
    }
  }

  function move(step) {
    var all = rows();
    if (!all.length) return;
    var at = all.indexOf(current());
    var next = at < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, at + step));
    select(all[next], true);
  }

  function clickIn(selector) {
    var row = current();
    var target = row && row.querySelector(selector);
    if (!target) return false;
    target.click();
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    var where = event.target;
    if (where && where.closest && where.closest("input, textarea, select, [contenteditable]")) return;
    if (!document.getElementById("results")) return;
    var handled = true;
    switch (event.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "o": handled = clickIn("a.open"); break;
      case "c": handled = clickIn("button.claim"); break;
      default: handled = false;
    }
    if (handled) event.preventDefault();
  });

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!target || !target.closest) return;
    var row = target.closest("#results tr[data-attempt]");
    if (row) select(row, false);
    var copy = target.closest("button[data-copy]");
    if (copy && navigator.clipboard) {
      navigator.clipboard.writeText(copy.getAttribute("data-copy")).then(function () {
        copy.textContent = "copied";
        window.setTimeout(function () { copy.textContent = "copy"; }, 1500);
      }, function () { /* no clipboard here: the full value is in the title */ });
    }
  });

  // The results region is replaced when it refreshes itself (or a row after
  // a claim): remember the selected row, ticked boxes and focus; restore them.
  document.addEventListener("htmx:beforeSwap", function () {
    checkedIds = Array.prototype.map.call(
      document.querySelectorAll('#results input[name="ids"]:checked'),
      function (box) { return box.value; }
    );
    var active = document.activeElement;
    focusWasInResults = !!(active && active.closest && active.closest("#results"));
  });

  // A bulk assignment went through: its selection is spent.
  document.addEventListener("ledgerdash:refresh", function () {
    checkedIds = [];
    Array.prototype.forEach.call(document.querySelectorAll('#results input[name="ids"]:checked'), function (box) {
      box.checked = false;
    });
  });

  document.addEventListener("htmx:afterSettle", function () {
    checkedIds.forEach(function (id) {
      var box = document.querySelector('#results input[name="ids"][value="' + id + '"]');
      if (box) box.checked = true;
    });
    var row = current();
    mark(row);
    if (row && focusWasInResults) row.focus({ preventScroll: true });
  });
})();
