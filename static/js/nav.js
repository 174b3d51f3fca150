// The main menu of templates/base.html (dashboard/navigation.py). Its dropdowns are <details>, which
// open and close with the keyboard and without this script; the script makes them behave as a
// menu is expected to: one open at a time, closed by Escape (focus back on its heading) and by a
// click or focus elsewhere. On a narrow screen it folds the menu and the session behind the
// "Menu" button; without the script they stay unfolded below the bar. Loaded in <head> (not
// deferred), so the folded state applies before the first paint.
(function () {
  document.documentElement.classList.add("js-nav");

  function setUp() {
    var toggle = document.querySelector(".menu-toggle");
    var menu = document.getElementById("topmenu");
    var groups = Array.prototype.slice.call(document.querySelectorAll("details.navgroup"));
    if (!menu) { return; }

    function narrow() { return toggle && getComputedStyle(toggle).display !== "none"; }
    function closeGroups(except) {
      groups.forEach(function (group) { if (group !== except) { group.open = false; } });
    }
    function setFolded(folded) {
      menu.classList.toggle("open", !folded);
      toggle.setAttribute("aria-expanded", folded ? "false" : "true");
      if (!folded) {
        // Unfolded on a phone: the section of the page shown is open, the rest closed.
        groups.forEach(function (group) { group.open = group.classList.contains("current"); });
      }
    }

    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () { setFolded(menu.classList.contains("open")); });
    }
    groups.forEach(function (group) {
      group.addEventListener("toggle", function () {
        if (group.open && !narrow()) { closeGroups(group); }
      });
      group.addEventListener("focusout", function (event) {
        if (!narrow() && !group.contains(event.relatedTarget)) { group.open = false; }
      });
    });
    document.addEventListener("click", function (event) {
      if (!narrow()) {
        groups.forEach(function (group) { if (!group.contains(event.target)) { group.open = false; } });
      }
    });
    document.addEventListener("keydown", function (event) {
      if (event.key !== "Escape") { return; }
      var open = groups.filter(function (group) { return group.open; });
      if (open.length && !narrow()) {
        open.forEach(function (group) { group.open = false; });
        open[0].querySelector("summary").focus();
      } else if (toggle && narrow() && menu.classList.contains("open")) {
        setFolded(true);
        toggle.focus();
      }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUp);
  } else {
    setUp();
  }
})();
