// Scheduler policy form: show ARR only for equal/fixed share, frequency and averaging factor only
// with ARR, the time slice only without it. Hidden fields are emptied so the server never gets a
// value the admin cannot see (it would be refused by the rules anyway).
(function () {
  function update(form) {
    var policy = form.querySelector("[name=policy]").value;
    var arrBox = form.querySelector("[name=arr]");
    var share = policy !== "best_effort";
    if (!share) { arrBox.checked = false; }
    var arr = share && arrBox.checked;
    form.querySelectorAll("[data-needs]").forEach(function (el) {
      var need = el.getAttribute("data-needs");
      var shown = need === "share" ? share : need === "arr" ? arr : share && !arr;
      el.hidden = !shown;
      if (!shown) {
        el.querySelectorAll("input[type=number]").forEach(function (input) { input.value = ""; });
      }
    });
  }
  document.querySelectorAll("[data-scheduler-form]").forEach(function (fields) {
    var form = fields.closest("form");
    form.addEventListener("change", function () { update(form); });
    update(form);
  });
})();
