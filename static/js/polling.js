/* Requests a page makes on its own are marked, so that they do not count as the user's activity.

   An htmx element whose own trigger polls (hx-trigger="every 15s": the overview, the agent list, a
   running operation) refreshes itself with no one at the screen. Each of its polls carries the
   header X-Fleet-Poll: 1, and the server leaves the session's last-seen time alone for it
   (identity/sessions.py), so an overview left open still signs out after the idle timeout. Only
   the polling element's own timer counts: a button inside it, or a click on an element whose
   trigger also polls, is the user. */
(function () {
  "use strict";
  const POLLS = /(^|,)\s*every\s/;

  document.addEventListener("htmx:configRequest", (event) => {
    const element = event.detail.elt;
    const trigger = (element && (element.getAttribute("hx-trigger") || element.getAttribute("data-hx-trigger"))) || "";
    if (POLLS.test(trigger) && !event.detail.triggeringEvent) {
      event.detail.headers["X-Fleet-Poll"] = "1";
    }
  });
})();
