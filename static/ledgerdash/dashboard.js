// Keyboard shortcuts and small comforts for the dashboard's lists.
//
// A same-origin file (the CSP allows scripts from 'self' and with the page's
// nonce only), so no inline handlers anywhere: everything is delegated from
// the document. Pages work without it; it only adds the shortcuts (which the
// user can turn off) and the copy buttons.
(function () {
  "use strict";

  var selectedId = null;
  var SHORTCUTS_KEY = "ledgerdash.shortcuts";

  function shortcutsOn() {
    try { return window.localStorage.getItem(SHORTCUTS_KEY) !== "off"; } catch (e) { return true; }
  }

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
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented || !shortcutsOn()) return;
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

  // The list is morphed in place when it refreshes (idiomorph): focus and
  // the ticked boxes (sent with the refresh, rendered ticked) survive on
  // their own. The row the keys selected is this script's, so it is marked
  // again.
  document.addEventListener("htmx:afterSettle", function () { mark(current()); });

  // A bulk decision went through: its selection is spent. Capture phase, so
  // the boxes are unticked before the refresh this event starts reads them.
  document.addEventListener("ledgerdash:refresh", function () {
    Array.prototype.forEach.call(document.querySelectorAll('#results input[name="ids"]:checked'), function (box) {
      box.checked = false;
    });
  }, true);

  // The shortcuts can be turned off (WCAG 2.1.4), remembered in this browser.
  function showToggle() {
    var toggle = document.getElementById("shortcuts-toggle");
    if (!toggle) return;
    toggle.hidden = false;
    toggle.setAttribute("aria-pressed", shortcutsOn() ? "true" : "false");
    toggle.textContent = shortcutsOn() ? "Turn keyboard shortcuts off" : "Turn keyboard shortcuts on";
  }
  document.addEventListener("click", function (event) {
    var toggle = event.target && event.target.closest && event.target.closest("#shortcuts-toggle");
    if (!toggle) return;
    try { window.localStorage.setItem(SHORTCUTS_KEY, shortcutsOn() ? "off" : "on"); } catch (e) { /* private mode */ }
    showToggle();
  });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", showToggle);
  else showToggle();
})();
