// Filters that apply as soon as a choice is made: a <select data-autosubmit> submits its form on
// change (a script file, not an inline onchange handler, which the content security policy refuses).
(function () {
  document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
})();
